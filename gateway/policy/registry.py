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


@dataclass(frozen=True, slots=True)
class _LoadedEntry(Generic[R]):
    """A policy file's active version, the runtime built from it, and when it was loaded."""

    loaded: LoadedPolicy
    runtime: R
    loaded_at: str


@dataclass(frozen=True)
class _Snapshot(Generic[R]):
    by_path: dict[Path, _LoadedEntry[R]] = field(default_factory=dict)
    by_tenant: dict[str, R] = field(default_factory=dict)
    by_key: dict[str, R] = field(default_factory=dict)
    errors: dict[Path, str] = field(default_factory=dict)
    fingerprint: tuple[tuple[str, int, int, int], ...] = ()


@dataclass
class _Reload(Generic[R]):
    """What one reload builds from the `old` snapshot: entries, errors, changes to report."""

    old: _Snapshot[R]
    actor: str
    by_path: dict[Path, _LoadedEntry[R]] = field(default_factory=dict)
    errors: dict[Path, str] = field(default_factory=dict)
    changes: list[PolicyChange] = field(default_factory=list)

    def keep_last_good(self, path: Path, error: str) -> None:
        """Record why `path` failed; its last good version, if any, stays active."""
        self.errors[path] = error
        previous = self.old.by_path.get(path)
        if previous is not None:
            self.by_path[path] = previous

    def report_removed(self) -> None:
        """A change for each policy whose file is gone from the folder."""
        for path, entry in self.old.by_path.items():
            if path not in self.by_path and not path.exists():
                self.changes.append(
                    PolicyChange(
                        path,
                        entry.loaded.policy.name,
                        entry.loaded.version,
                        None,
                        "file removed",
                        self.actor,
                    )
                )


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
        return [entry.loaded for entry in self._snapshot.by_path.values()]

    def status(self) -> list[PolicyStatus]:
        snapshot = self._snapshot
        paths = sorted(set(snapshot.by_path) | set(snapshot.errors))
        result = []
        for path in paths:
            entry = snapshot.by_path.get(path)
            result.append(
                PolicyStatus(
                    path=str(path),
                    name=entry.loaded.policy.name if entry else None,
                    version=entry.loaded.version if entry else None,
                    loaded_at=entry.loaded_at if entry else None,
                    error=snapshot.errors.get(path),
                )
            )
        return result

    def reload(self, actor: str = "watcher", force: bool = False) -> list[PolicyChange]:
        """Re-read the folder if any file changed; return what changed."""
        with self._reload_lock:
            fingerprint = self._fingerprint()
            if fingerprint == self._snapshot.fingerprint and not force:
                return []
            state = _Reload(self._snapshot, actor)
            for path in sorted(self._folder.glob("*.yaml")):
                self._load_file(state, path)
            state.report_removed()
            self._snapshot = self._rebind(state, fingerprint)
        for change in state.changes:
            if self._on_change is not None:
                self._on_change(change)
        return state.changes

    def _load_file(self, state: _Reload[R], path: Path) -> None:
        """Bring `path` into `state`: reused if unchanged, else loaded and built."""
        previous = state.old.by_path.get(path)
        old_version = previous.loaded.version if previous else None
        try:
            loaded = load_policy(path)
        except PolicyError as exc:
            state.keep_last_good(path, str(exc))
            if state.old.errors.get(path) != str(exc):  # the same error is reported once
                name = previous.loaded.policy.name if previous else None
                change = PolicyChange(path, name, old_version, None, str(exc), state.actor)
                self._report_failure(state, change, "policy.reload_failed", exc)
            return
        if previous is not None and previous.loaded.version == loaded.version:
            state.by_path[path] = previous
            return
        try:
            runtime = self._build(loaded)
        except Exception as exc:  # a valid file the guardrails cannot honour
            error = f"{path}: {exc}"
            state.keep_last_good(path, error)
            change = PolicyChange(path, loaded.policy.name, old_version, None, error, state.actor)
            self._report_failure(state, change, "policy.build_failed", exc)
            return
        state.by_path[path] = _LoadedEntry(loaded, runtime, utc_now().isoformat())
        state.changes.append(
            PolicyChange(path, loaded.policy.name, old_version, loaded.version, None, state.actor)
        )
        log.info("policy.loaded", path=str(path), version=loaded.version[:12])

    def _report_failure(
        self, state: _Reload[R], change: PolicyChange, event: str, exc: Exception
    ) -> None:
        self.reload_failures += 1
        log.error(event, path=str(change.path), error=str(exc))
        state.changes.append(change)

    def _rebind(
        self, state: _Reload[R], fingerprint: tuple[tuple[str, int, int, int], ...]
    ) -> _Snapshot[R]:
        """The snapshot of `state`'s entries, with their tenants and keys bound."""
        by_tenant, by_key = self._bindings(state.by_path, state.errors)
        return _Snapshot(state.by_path, by_tenant, by_key, state.errors, fingerprint)

    def _bindings(
        self, by_path: dict[Path, _LoadedEntry[R]], errors: dict[Path, str]
    ) -> tuple[dict[str, R], dict[str, R]]:
        by_tenant: dict[str, R] = {}
        by_key: dict[str, R] = {}
        owners: dict[tuple[str, str], Path] = {}
        for path, entry in sorted(by_path.items()):
            binding = entry.loaded.policy.applies_to
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
                    table[name] = entry.runtime
        return by_tenant, by_key

    def _fingerprint(self) -> tuple[tuple[str, int, int, int], ...]:
        # The inode too: a ConfigMap volume's update swaps its `..data` link to a folder of
        # new files, which may keep the old ones' sizes and times.
        entries = []
        for path in sorted(self._folder.glob("*.yaml")):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            entries.append((path.name, stat.st_ino, stat.st_mtime_ns, stat.st_size))
        return tuple(entries)
