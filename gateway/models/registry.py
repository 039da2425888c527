"""The models the gateway serves: the embedded engine (unless the models file turns it off)
and one upstream engine per model of the models file, hot-reloaded.

A changed file is validated first and swapped in only when valid: a bad edit keeps the last
good version serving, is logged and counted (`reload_failures`, `error`), and never takes
the service down. Engines of models that an edit removed or changed are closed; their
streams in flight finish first (`UpstreamEngine.close`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from engine import Engine, UpstreamConfig, UpstreamEngine
from gateway.models.schema import LoadedModels, ModelsFileError, load_models_file

log = structlog.get_logger(__name__)

# A file's modification time and size; None while it is missing.
_Fingerprint = tuple[int, int, int] | None


class UnknownModel(LookupError):
    """No served model has the requested id."""

    def __init__(self, requested: str, available: list[str]) -> None:
        self.requested = requested
        self.available = available
        listed = ", ".join(available) or "none"
        super().__init__(f"The model '{requested}' does not exist. Available: {listed}.")


@dataclass(frozen=True)
class _Snapshot:
    loaded: LoadedModels | None = None
    upstreams: dict[str, Engine] = field(default_factory=dict)
    configs: dict[str, UpstreamConfig] = field(default_factory=dict)
    fingerprint: _Fingerprint = (-1, -1, -1)  # never a file's: the first look loads

    @property
    def embedded(self) -> bool:
        return self.loaded is None or self.loaded.embedded


class ModelRegistry:
    """Lookups by model id over one immutable snapshot, replaced atomically by `reload`."""

    def __init__(
        self,
        path: Path | None,
        embedded: Engine | None,
        build: Callable[[UpstreamConfig], Engine] = UpstreamEngine,
    ) -> None:
        self._path = path
        self._embedded = embedded
        self._build = build
        self._snapshot = _Snapshot()
        self._unstarted: list[Engine] = []  # built by a reload, awaiting `start_new`
        self._reload_lock = threading.Lock()
        self.reload_failures = 0
        self.error: str | None = None

    @property
    def version(self) -> str | None:
        loaded = self._snapshot.loaded
        return loaded.version if loaded else None

    def model_ids(self) -> list[str]:
        """What `/v1/models` lists: the embedded model first (when served), then the file's."""
        return [engine.model_id for engine in self.engines()]

    def engines(self) -> list[Engine]:
        """The engines of `model_ids`, in that order, from one snapshot."""
        snapshot = self._snapshot
        embedded = self._served_embedded(snapshot)
        return ([embedded] if embedded else []) + list(snapshot.upstreams.values())

    def engine_for(self, model_id: str | None) -> Engine:
        """The engine serving `model_id`; no id means the default (the embedded model,
        else the file's first). Raises UnknownModel."""
        snapshot = self._snapshot
        embedded = self._served_embedded(snapshot)
        if not model_id:
            if embedded is not None:
                return embedded
            if snapshot.upstreams:
                return next(iter(snapshot.upstreams.values()))
            raise UnknownModel("", self.model_ids())
        if embedded is not None and model_id == embedded.model_id:
            return embedded
        engine = snapshot.upstreams.get(model_id)
        if engine is None:
            raise UnknownModel(model_id, self.model_ids())
        return engine

    def reload(self, actor: str = "watcher") -> bool:
        """Re-read the file if it changed; True when a new version is serving. The first
        load raises ModelsFileError (a server must not start on a bad file); later ones
        keep the last good version."""
        if self._path is None:
            return False
        with self._reload_lock:
            fingerprint = self._fingerprint(self._path)
            old = self._snapshot
            if fingerprint == old.fingerprint:
                return False
            try:
                embedded_id = self._embedded.model_id if self._embedded else None
                loaded = load_models_file(self._path, embedded_id=embedded_id)
                if loaded.embedded and self._embedded is None:
                    raise ValueError(
                        f"{self._path}: embedded: true needs a restart (the embedded model "
                        "was not loaded: the file turned it off at start)"
                    )
                if loaded.version == (old.loaded.version if old.loaded else None):
                    self._snapshot = _Snapshot(old.loaded, old.upstreams, old.configs, fingerprint)
                    return False
                new = self._built(loaded, old, fingerprint)
            except (ModelsFileError, ValueError, OSError) as exc:
                if old.loaded is None and actor == "startup":
                    raise
                self._keep_last_good(old, fingerprint, exc)
                return False
            self._snapshot = new
            self.error = None
        self._close_replaced(old, new)
        log.info(
            "models.loaded", actor=actor, version=loaded.version[:12], models=list(new.upstreams)
        )
        return True

    def _served_embedded(self, snapshot: _Snapshot) -> Engine | None:
        return self._embedded if snapshot.embedded else None

    async def start_new(self) -> None:
        """Start the engines that reloads built, on the serving loop: their health checks
        begin and each reads its context window from its upstream before a request needs
        it (an engine nobody started starts on its first request)."""
        pending, self._unstarted = self._unstarted, []
        for engine in pending:
            if not isinstance(engine, UpstreamEngine):
                continue
            try:
                await engine.start()
            except Exception:  # an upstream that is down at start is its health check's job
                log.warning("models.start_failed", model=engine.model_id, exc_info=True)

    def close(self) -> None:
        """Close every upstream engine (the embedded one is the caller's)."""
        for engine in self._snapshot.upstreams.values():
            engine.close()

    def _built(self, loaded: LoadedModels, old: _Snapshot, fingerprint: _Fingerprint) -> _Snapshot:
        """The snapshot of `loaded`: an unchanged model keeps its engine, others get one."""
        upstreams: dict[str, Engine] = {}
        configs: dict[str, UpstreamConfig] = {}
        for config in loaded.upstreams:
            kept = old.upstreams.get(config.model_id)
            same = kept is not None and old.configs.get(config.model_id) == config
            if same and kept is not None:
                upstreams[config.model_id] = kept
            else:
                upstreams[config.model_id] = self._build(config)
                self._unstarted.append(upstreams[config.model_id])
            configs[config.model_id] = config
        return _Snapshot(loaded, upstreams, configs, fingerprint)

    def _keep_last_good(self, old: _Snapshot, fingerprint: _Fingerprint, exc: Exception) -> None:
        # The fingerprint is kept so that the same bad edit is reported once, not each look.
        self._snapshot = _Snapshot(old.loaded, old.upstreams, old.configs, fingerprint)
        self.reload_failures += 1
        self.error = str(exc)
        log.error("models.reload_failed", path=str(self._path), error=str(exc))

    @staticmethod
    def _close_replaced(old: _Snapshot, new: _Snapshot) -> None:
        for model_id, engine in old.upstreams.items():
            if new.upstreams.get(model_id) is not engine:
                engine.close()

    @staticmethod
    def _fingerprint(path: Path) -> _Fingerprint:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        # The inode too: a ConfigMap volume's update swaps its `..data` link to a new file,
        # which may keep the old one's size and time.
        return (stat.st_ino, stat.st_mtime_ns, stat.st_size)
