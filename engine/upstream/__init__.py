"""An engine that forwards to OpenAI-compatible servers: vLLM, SGLang, NIM, TGI, llama.cpp."""

from engine.upstream.config import TokenizerKind, UpstreamConfig, UpstreamTimeouts
from engine.upstream.engine import DEFAULT_CONTEXT_WINDOW, UpstreamEngine

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "TokenizerKind",
    "UpstreamConfig",
    "UpstreamEngine",
    "UpstreamTimeouts",
]
