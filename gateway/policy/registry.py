"""The active policies: loaded from a folder, bound to tenants and keys, hot-reloaded.

A changed file is validated first and swapped in only when valid; an invalid edit keeps
the last good version of that policy active and is reported (log, `errors`, admin API,
audit). Lookups read one immutable snapshot, replaced atomically by each reload.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import structlog

from gateway.db.models import utc_now
from gateway.keys.store import KeyIdentity
from gateway.policy.schema import LoadedPolicy, PolicyError, load_policy

log = structlog.get_logger(__name__)

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """One outcome of a reload, for the audit log."""

    path: Path
    name: str | None
    old_version: str | None
    new_version: str | None
    error: str | None
    actor: str


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    path: str
    name: str | None
    version: str | None
    loaded_at: str | None
    error: str | None


@dataclass(frozen=True)
class _Snapshot(Generic[R]):
    by_path: dict[Path, tuple[LoadedPolicy, R, str]] = field(default_factory=dict)
    by_tenant: dict[str, R] = field(default_factory=dict)
    by_key: dict[str, R] = field(default_factory=dict)
    errors: dict[Path, str] = field(default_factory=dict)
    fingerprint: tuple[tuple[str, int, int], ...] = ()


class NoPolicyError(LookupError):
    """No policy is bound to the caller's key or tenant: the request must be refused."""


class PolicyRegistry(Generic[R]):
    """Policies of one folder, with the runtime object (`R`) that each one builds."""

    def __init__(
        self,
        folder: Path,
        build: Callable[[LoadedPolicy], R],
        on_change: Callable[[PolicyChange], object] | None = None,
    ) -> None:
        self._folder = folder
        self._build = build
        self._on_change = on_change
        self._snapshot: _Snapshot[R] = _Snapshot()
        self._reload_lock = threading.Lock()
        self.reload_failures = 0

    @property
    def folder(self) -> Path:
        return self._folder

    def for_identity(self, identity: KeyIdentity) -> R:
        """The runtime for a caller: its key's policy, else its tenant's; else refuse."""
        snapshot = self._snapshot
        runtime = snapshot.by_key.get(identity.key_id) or snapshot.by_tenant.get(identity.tenant)
        if runtime is None:
            raise NoPolicyError(f"No policy is bound to tenant '{identity.tenant}' or to this key.")
        return runtime

    def for_tenant(self, tenant: str) -> R | None:
        return self._snapshot.by_tenant.get(tenant)

    def loaded(self) -> list[LoadedPolicy]:
        return [loaded for loaded, _, _ in self._snapshot.by_path.values()]

    def status(self) -> list[PolicyStatus]:
        snapshot = self._snapshot
        paths = sorted(set(snapshot.by_path) | set(snapshot.errors))
        result = []
        for path in paths:
            entry = snapshot.by_path.get(path)
            result.append(
                PolicyStatus(
                    path=str(path),
                    name=entry[0].policy.name if entry else None,
                    version=entry[0].version if entry else None,
                    loaded_at=entry[2] if entry else None,
                    error=snapshot.errors.get(path),
                )
            )
        return result

    def reload(self, actor: str = "watcher", force: bool = False) -> list[PolicyChange]:
        """Re-read the folder if any file changed; return what changed."""
        with self._reload_lock:
            fingerprint = self._fingerprint()
            old = self._snapshot
            if fingerprint == old.fingerprint and not force:
                return []
            by_path: dict[Path, tuple[LoadedPolicy, R, str]] = {}
            errors: dict[Path, str] = {}
            changes: list[PolicyChange] = []
            for path in sorted(self._folder.glob("*.yaml")):
                previous = old.by_path.get(path)
                try:
                    loaded = load_policy(path)
                except PolicyError as exc:
                    errors[path] = str(exc)
                    if previous is not None:
                        by_path[path] = previous  # the last good version stays active
                    if old.errors.get(path) != errors[path]:
                        self.reload_failures += 1
                        log.error("policy.reload_failed", path=str(path), error=str(exc))
                        changes.append(
                            PolicyChange(
                                path,
                                previous[0].policy.name if previous else None,
                                previous[0].version if previous else None,
                                None,
                                str(exc),
                                actor,
                            )
                        )
                    continue
                if previous is not None and previous[0].version == loaded.version:
                    by_path[path] = previous
                    continue
                try:
                    runtime = self._build(loaded)
                except Exception as exc:  # a valid file the guardrails cannot honour
                    errors[path] = f"{path}: {exc}"
                    if previous is not None:
                        by_path[path] = previous
                    self.reload_failures += 1
                    log.error("policy.build_failed", path=str(path), error=str(exc))
                    changes.append(
                        PolicyChange(
                            path,
                            loaded.policy.name,
                            previous[0].version if previous else None,
                            None,
                            errors[path],
                            actor,
                        )
                    )
                    continue
                by_path[path] = (loaded, runtime, utc_now().isoformat())
                old_version = previous[0].version if previous else None
                changes.append(
                    PolicyChange(path, loaded.policy.name, old_version, loaded.version, None, actor)
                )
                log.info("policy.loaded", path=str(path), version=loaded.version[:12])
            for path, (loaded, _, _) in old.by_path.items():
                if path not in by_path and not path.exists():
                    changes.append(
                        PolicyChange(
                            path, loaded.policy.name, loaded.version, None, "file removed", actor
                        )
                    )
            by_tenant, by_key = self._bindings(by_path, errors)
            self._snapshot = _Snapshot(by_path, by_tenant, by_key, errors, fingerprint)
        for change in changes:
            if self._on_change is not None:
                self._on_change(change)
        return changes

    def _bindings(
        self, by_path: dict[Path, tuple[LoadedPolicy, R, str]], errors: dict[Path, str]
    ) -> tuple[dict[str, R], dict[str, R]]:
        by_tenant: dict[str, R] = {}
        by_key: dict[str, R] = {}
        owners: dict[tuple[str, str], Path] = {}
        for path, (loaded, runtime, _) in sorted(by_path.items()):
            binding = loaded.policy.applies_to
            for kind, names, table in (
                ("tenant", binding.tenants, by_tenant),
                ("key", binding.keys, by_key),
            ):
                for name in names:
                    owner = owners.get((kind, name))
                    if owner is not None:
                        errors[path] = (
                            f"{path}: {kind} '{name}' is already bound by "
                            f"{owner.name}; this binding is ignored"
                        )
                        continue
                    owners[(kind, name)] = path
                    table[name] = runtime
        return by_tenant, by_key

    def _fingerprint(self) -> tuple[tuple[str, int, int], ...]:
        entries = []
        for path in sorted(self._folder.glob("*.yaml")):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            entries.append((path.name, stat.st_mtime_ns, stat.st_size))
        return tuple(entries)
