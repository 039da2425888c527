"""`bastion keys create` warns when no policy binds the new key's tenant, and says which
folder and field to edit; the key is made either way (exit 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.keys.store import authenticate
from gateway.keys.tenant_binding import tenants_bound_in
from gateway.services import open_database
from gateway.settings import Settings


@pytest.fixture
def policy_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder and a policy folder with one policy binding tenant acme."""
    monkeypatch.setenv("BASTION_DATA_DIR", str(tmp_path / "data"))
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "acme.yaml").write_text("name: acme\napplies_to:\n  tenants: [acme, beta]\n")
    monkeypatch.setenv("BASTION_POLICY_DIR", str(folder))
    return folder


def test_tenants_bound_in_reads_valid_files_only(policy_dir: Path) -> None:
    (policy_dir / "broken.yaml").write_text("name: broken\napplies_to:\n  tenant: [gamma]\n")
    (policy_dir / "notes.txt").write_text("applies_to: {tenants: [delta]}\n")
    assert tenants_bound_in(policy_dir) == {"acme", "beta"}


def test_keys_create_warns_on_stderr_when_no_policy_binds_the_tenant(
    policy_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "--tenant", "globex", "--role", "user"]) == 0
    out, err = capsys.readouterr()
    secret = out.strip()
    identity = authenticate(open_database(Settings()), secret)
    assert identity is not None and identity.tenant == "globex"
    assert (
        f"warning: No policy binds tenant 'globex': add it to `applies_to.tenants` of a "
        f"policy in {policy_dir}." in err
    )
    assert secret not in err


def test_keys_create_for_a_bound_tenant_prints_no_warning(
    policy_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "--tenant", "acme", "--role", "admin"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("bst_")
    assert "key id " in err and "warning" not in err
