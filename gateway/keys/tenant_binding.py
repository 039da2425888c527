"""Whether a new key's tenant is bound by a policy: a key no policy serves gets 403 on
every request, so its creator is told at once which file and field to edit."""

from __future__ import annotations

from pathlib import Path

from gateway.policy.schema import PolicyError, load_policy


def tenants_bound_in(policy_dir: Path) -> set[str]:
    """Tenants the valid policy files of `policy_dir` bind (`applies_to.tenants`), for the
    CLI, which has no running registry; an invalid file binds nothing at start-up either."""
    tenants: set[str] = set()
    for path in sorted(policy_dir.glob("*.yaml")):
        try:
            tenants.update(load_policy(path).policy.applies_to.tenants)
        except PolicyError:
            continue  # `bastion policy check` reports it
    return tenants


def unbound_tenant_warning(tenant: str, policy_dir: Path) -> str:
    """What an admin should do when no policy binds `tenant`."""
    return (
        f"No policy binds tenant '{tenant}': add it to `applies_to.tenants` of a policy in "
        f"{policy_dir}. Until then every request with this key is refused (403)."
    )
