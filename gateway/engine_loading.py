"""The embedded engine: its settings, its load, and `bastion serve`'s early start of it.

`bastion serve` spends its first seconds importing (torch and transformers, then presidio,
spaCy and the web stack), one module at a time on one core. `start_engine_load` imports
what the engine's load needs first, then loads it on a thread of its own while the main
thread imports the rest, so the engine's load uses the core the imports leave idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from gateway.settings import Settings

if TYPE_CHECKING:
    from engine import Engine, EngineConfig

log = structlog.get_logger(__name__)
T = TypeVar("T")


def engine_config(settings: Settings) -> EngineConfig:
    """The engine's settings as the operator gave them; the engine resolves `auto`
    weights for its device itself."""
    from engine import EngineConfig

    config = EngineConfig(
        weights=settings.engine_weights,
        num_threads=settings.engine_threads,
        native_decode=settings.native_decode,
        native_cache_dir=settings.native_cache_dir,
        speculative_tokens=settings.speculative_tokens,
    )
    if settings.kv_cache_mb is None:
        return config
    return replace(config, kv_cache_mb=settings.kv_cache_mb)


def load_engine(settings: Settings) -> Engine:
    """The embedded engine on the configured model (default: SmolLM2) and device."""
    import torch

    from engine import PagedEngine, default_model_source, model_source_from_path

    source = model_source_from_path(settings.model_path) if settings.model_path else None
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return PagedEngine.load(
        source or default_model_source(), device=device, config=engine_config(settings)
    )


def wants_embedded_engine(settings: Settings) -> bool:
    """Whether the gateway serves the embedded engine: unless its models file turns it off.

    A models file that does not load counts as no: `load_services` reports its errors.
    """
    if settings.models_file is None:
        return True
    from gateway.models import load_models_file

    try:
        return load_models_file(settings.models_file).embedded
    except Exception:
        return False


def import_engine_modules() -> None:
    """Import every module the default engine's load imports (the GGUF reader, transformers'
    Llama), so that loading it on a thread imports nothing while another thread imports:
    two threads importing modules that import each other can meet a half-initialised one."""
    import transformers.models.auto.tokenization_auto
    import transformers.models.llama.modeling_llama
    import transformers.models.llama.tokenization_llama_fast  # noqa: F401

    import engine
    import engine.gguf_model  # noqa: F401


def start_engine_load(settings: Settings) -> Future[Engine | None]:
    """Import the engine's modules, then return while the engine loads on a thread.

    The future holds the engine, None where the models file turns it off, or the load's
    error.
    """
    import_engine_modules()
    loaded: Future[Engine | None] = Future()
    if not wants_embedded_engine(settings):
        loaded.set_result(None)
        return loaded

    def load() -> None:
        try:
            loaded.set_result(timed_stage("engine", load_engine, settings))
        except BaseException as exc:  # handed to whoever waits for the engine
            loaded.set_exception(exc)

    threading.Thread(target=load, name="load-engine", daemon=True).start()
    return loaded


def timed_stage(stage: str, load: Callable[..., T], *args: Any) -> T:
    """`load(*args)`, logging how long the start-up stage took."""
    started = time.perf_counter()
    result = load(*args)
    log.info("gateway.stage_loaded", stage=stage, seconds=round(time.perf_counter() - started, 2))
    return result
