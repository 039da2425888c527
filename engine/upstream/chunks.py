"""One streamed answer read chunk by chunk: its text, logprobs, finish reason and usage.

Chat chunks carry `choices[0].delta.content` (and `logprobs.content`); completions chunks
`choices[0].text` (and the legacy `logprobs`). With `stream_options.include_usage` the
upstream sends `usage` in a last chunk (often with empty `choices`); until then the answer's
tokens are counted a chunk at a time (one token a chunk, or one a logprob entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.types import FinishReason, TextLogprob
from engine.upstream.sse import MalformedStream


class UpstreamStreamError(Exception):
    """The upstream reported an error inside the stream (`{"error": ...}`)."""


@dataclass(frozen=True, slots=True)
class ChunkText:
    """What one chunk adds to the answer."""

    text: str
    logprobs: tuple[TextLogprob, ...] = ()


@dataclass(slots=True)
class AnswerReader:
    """Reads the chunks of one answer; `finish_reason` and the counts once they arrive."""

    is_chat: bool
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    finish_reason: FinishReason | None = None
    has_usage: bool = False
    _counted: int = field(default=0)

    def read(self, event: dict[str, Any]) -> ChunkText:
        """The text of `event`; raises `MalformedStream` or `UpstreamStreamError`."""
        if "error" in event:
            raise UpstreamStreamError(_error_message(event["error"]))
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._read_usage(usage)
        choices = event.get("choices")
        if choices is None and usage is not None:
            return ChunkText("")
        if not isinstance(choices, list):
            raise MalformedStream("a chunk without a `choices` list")
        if not choices:
            return ChunkText("")
        choice = choices[0]
        if not isinstance(choice, dict):
            raise MalformedStream("a choice that is not an object")
        text, logprobs = self._choice_text(choice)
        reason = choice.get("finish_reason")
        if reason is not None:
            self.finish_reason = "length" if reason == "length" else "stop"
        if text or logprobs:
            self._counted += len(logprobs) or 1
            if not self.has_usage:
                self.completion_tokens = self._counted
        return ChunkText(text, logprobs)

    def _choice_text(self, choice: dict[str, Any]) -> tuple[str, tuple[TextLogprob, ...]]:
        if self.is_chat:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedStream("a chat chunk whose `delta` is not an object")
            text = delta.get("content") or ""
            logprobs = _chat_logprobs(choice.get("logprobs"))
        else:
            text = choice.get("text") or ""
            logprobs = _completion_logprobs(choice.get("logprobs"))
        if not isinstance(text, str):
            raise MalformedStream("a chunk whose text is not a string")
        return text, logprobs

    def _read_usage(self, usage: dict[str, Any]) -> None:
        try:
            self.completion_tokens = int(usage.get("completion_tokens", self._counted))
            self.prompt_tokens = int(usage.get("prompt_tokens", 0))
            details = usage.get("prompt_tokens_details") or {}
            self.cached_prompt_tokens = int(details.get("cached_tokens") or 0)
        except (TypeError, ValueError, AttributeError) as exc:
            raise MalformedStream(f"a usage object that is not counts: {usage!r:.80}") from exc
        self.has_usage = True


def _chat_logprobs(value: Any) -> tuple[TextLogprob, ...]:
    if not isinstance(value, dict) or not isinstance(value.get("content"), list):
        return ()
    try:
        return tuple(
            TextLogprob(
                str(entry["token"]),
                float(entry["logprob"]),
                tuple(
                    (str(top["token"]), float(top["logprob"]))
                    for top in entry.get("top_logprobs") or ()
                ),
            )
            for entry in value["content"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedStream("logprobs that are not OpenAI's shape") from exc


def _completion_logprobs(value: Any) -> tuple[TextLogprob, ...]:
    if not isinstance(value, dict) or not isinstance(value.get("tokens"), list):
        return ()
    tops = value.get("top_logprobs") or [None] * len(value["tokens"])
    try:
        return tuple(
            TextLogprob(
                str(token),
                float(logprob),
                tuple((str(t), float(p)) for t, p in (top or {}).items()),
            )
            for token, logprob, top in zip(
                value["tokens"], value["token_logprobs"], tops, strict=True
            )
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedStream("legacy logprobs that are not OpenAI's shape") from exc


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
