"""Data that crosses the engine's boundary: what to generate and what comes back."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "cancelled"]
ConstraintKind = Literal["json_schema", "json_object", "regex", "grammar", "structural_tag"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of the conversation, after guardrails and retrieval have shaped it."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str


@dataclass(frozen=True, slots=True)
class Constraint:
    """What every answer token must keep valid, compiled to a token mask at sampling.

    `source` is the JSON Schema (JSON text) for `json_schema`, the structural tag (JSON
    text, xgrammar's format) for `structural_tag`, the pattern for `regex` and the EBNF
    text for `grammar`; `json_object` takes any JSON object and ignores it.
    """

    kind: ConstraintKind
    source: str = ""

    @property
    def key(self) -> str:
        """Identifies the compiled grammar: the SHA-256 of the kind and the source."""
        return hashlib.sha256(f"{self.kind}\0{self.source}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. `temperature == 0` means greedy.

    `speculative` lets the engine verify prompt-lookup drafts for this request where its
    config enables speculation (`EngineConfig.speculative_tokens`); the output is the same
    either way (greedy) or has the same distribution (sampled).
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    constraint: Constraint | None = None
    speculative: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 disables it)")
        if not -2 <= self.presence_penalty <= 2 or not -2 <= self.frequency_penalty <= 2:
            raise ValueError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError("top_logprobs must be in [0, 20]")
        if any(not -100 <= bias <= 100 for _, bias in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A chat to continue, or with `prompt` set a raw text to continue (no chat template).

    `cache_salt` keeps one tenant's cached state from another's.
    """

    request_id: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cache_salt: str = ""
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token with its log-probability and, if asked, the best alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TextLogprob:
    """A `TokenLogprob` as the caller reads it: each token as its text."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """A piece of the answer. The last delta of a stream carries `finish_reason`.

    `logprobs` holds one entry per token behind this delta when the request asked for them.
    `cached_prompt_tokens` counts the prompt tokens whose K/V came from the prefix cache
    (0 from an engine without one). `served_by` names the server that produced the
    answer, on every delta of an upstream engine's stream (a base URL; "" in-process).
    `prefill_s` is the time from the engine's scheduler admitting the request to its first
    token, so that tracing can tell the queue from the prefill (None where unknown: an
    upstream engine).
    """

    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: FinishReason | None = None
    logprobs: tuple[TextLogprob, ...] = ()
    cached_prompt_tokens: int = 0
    served_by: str = ""
    prefill_s: float | None = None


class EngineError(Exception):
    """Base class for errors the engine reports to its caller."""


class ConstraintError(EngineError):
    """A constraint that cannot be compiled (invalid, unsupported, or too slow to compile)."""


class EngineOverloaded(EngineError):
    """The engine's waiting queue is full; the caller should retry after a short while."""

    def __init__(self, waiting: int, retry_after_s: float = 1.0) -> None:
        self.waiting = waiting
        self.retry_after_s = retry_after_s
        super().__init__(
            f"The engine is overloaded ({waiting} requests waiting). Retry in {retry_after_s:g} s."
        )


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


UpstreamStatus = Literal[502, 503, 504]


class UpstreamUnavailable(EngineError):
    """No upstream server could answer: refused, failed, timed out or circuit open.

    `status` is the HTTP status the client gets (502 bad gateway, 503 unavailable, 504
    timeout); `upstream` names the server last tried (a base URL, never a key).
    """

    def __init__(
        self, message: str, *, status: UpstreamStatus, upstream: str, retry_after_s: float = 1.0
    ) -> None:
        self.status = status
        self.upstream = upstream
        self.retry_after_s = retry_after_s
        super().__init__(message)


class UpstreamRejected(EngineError):
    """An upstream server refused the request itself (a 4xx: too long a prompt, a bad
    parameter): the client's request is at fault, so it gets `status` (400 unless the
    upstream said 404, 413, 422 or 429) and the upstream's `message`, not a 502."""

    def __init__(self, message: str, *, status: int, upstream: str) -> None:
        self.status = status
        self.upstream = upstream
        super().__init__(message)


class UnsupportedParameter(EngineError):
    """A request parameter this engine cannot honour and will not silently drop (an
    upstream engine and `logit_bias`, whose ids name the local vocabulary). `param` is the
    OpenAI parameter's name, for the 400's `param` field."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(message)
