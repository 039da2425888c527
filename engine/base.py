"""The interface the gateway uses to run a model; implementations live beside it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from engine.types import ChatMessage, GenerationRequest, TokenDelta


class Engine(Protocol):
    """An in-process model server: async, streaming, cancellable.

    Closing the iterator returned by `stream` (or cancelling the task that reads it)
    stops the generation and frees what it held. A request whose sampling carries a
    constraint the engine cannot enforce raises `ConstraintError` before any token.
    """

    @property
    def model_id(self) -> str: ...

    @property
    def context_window(self) -> int: ...

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to `vocab_size - 1` (what `logit_bias` may name)."""
        ...

    def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int: ...

    def count_text_tokens(self, text: str) -> int:
        """Tokens of a raw prompt (`GenerationRequest.prompt`), without a chat template."""
        ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]: ...

    def close(self) -> None: ...
