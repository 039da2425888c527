"""Data that crosses the engine's boundary: what to generate and what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of the conversation, after guardrails and retrieval have shaped it."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. `temperature == 0` means greedy."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A chat to continue. `cache_salt` keeps one tenant's cached state from another's."""

    request_id: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cache_salt: str = ""


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """A piece of the answer. The last delta of a stream carries `finish_reason`."""

    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: FinishReason | None = None


class EngineError(Exception):
    """Base class for errors the engine reports to its caller."""


class ContextLengthExceeded(EngineError):
    """The prompt plus the room asked for the answer does not fit the model's context."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context_window: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_window = context_window
        super().__init__(
            f"This model's maximum context length is {context_window} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "max_tokens."
        )
