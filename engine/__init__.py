"""engine: the in-process inference engine behind a small async interface."""

from engine.base import Engine
from engine.hf_engine import TransformersEngine
from engine.model_source import (
    ModelNotFound,
    ModelSource,
    default_model_source,
    model_source_from_path,
)
from engine.types import (
    ChatMessage,
    ContextLengthExceeded,
    EngineError,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TokenDelta,
)

__all__ = [
    "ChatMessage",
    "ContextLengthExceeded",
    "Engine",
    "EngineError",
    "FinishReason",
    "GenerationRequest",
    "ModelNotFound",
    "ModelSource",
    "SamplingParams",
    "TokenDelta",
    "TransformersEngine",
    "default_model_source",
    "model_source_from_path",
]
