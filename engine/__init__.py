"""engine: the in-process inference engine behind a small async interface."""

import engine.process_settings  # noqa: F401  (first: settles Triton and oneDNN before torch loads)
from engine.base import Engine
from engine.config import DEFAULT_KV_CACHE_MB, EngineConfig, WeightChoice, resolve_engine_config
from engine.core import EngineMetrics
from engine.grammar import COMPILE_TIMEOUT_S
from engine.model_source import (
    ModelNotFound,
    ModelSource,
    default_model_source,
    model_source_from_path,
)
from engine.native_library import load_library as load_native_library
from engine.paged_engine import PagedEngine
from engine.reference_engine import TransformersEngine
from engine.types import (
    ChatMessage,
    Constraint,
    ConstraintError,
    ConstraintKind,
    ContextLengthExceeded,
    EngineError,
    EngineOverloaded,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TextLogprob,
    TokenDelta,
    TokenLogprob,
    UnsupportedParameter,
    UpstreamRejected,
    UpstreamUnavailable,
)
from engine.upstream import UpstreamConfig, UpstreamEngine, UpstreamTimeouts

__all__ = [
    "COMPILE_TIMEOUT_S",
    "DEFAULT_KV_CACHE_MB",
    "ChatMessage",
    "Constraint",
    "ConstraintError",
    "ConstraintKind",
    "ContextLengthExceeded",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineMetrics",
    "EngineOverloaded",
    "FinishReason",
    "GenerationRequest",
    "ModelNotFound",
    "ModelSource",
    "PagedEngine",
    "SamplingParams",
    "TextLogprob",
    "TokenDelta",
    "TokenLogprob",
    "TransformersEngine",
    "UnsupportedParameter",
    "UpstreamConfig",
    "UpstreamEngine",
    "UpstreamRejected",
    "UpstreamTimeouts",
    "UpstreamUnavailable",
    "WeightChoice",
    "default_model_source",
    "load_native_library",
    "model_source_from_path",
    "resolve_engine_config",
]
