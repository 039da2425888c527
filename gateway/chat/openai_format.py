"""OpenAI's response and stream-chunk objects for chat completions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine import TextLogprob
from gateway.chat.service import Answer, PreparedChat


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's `usage`; `cached_tokens` counts the prompt tokens the prefix cache served."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_body(chat: PreparedChat, answers: list[Answer]) -> dict[str, Any]:
    last = answers[-1]
    return {
        "id": chat.completion_id,
        "object": "chat.completion",
        "created": chat.created,
        "model": chat.model,
        "choices": [_choice(answer) for answer in answers],
        "usage": usage(last.prompt_tokens, last.completion_tokens, last.cached_prompt_tokens),
        "citations": chat.citations(),
    }


def _choice(answer: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.content,
        "refusal": answer.refusal,
    }
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    logprobs = None
    if answer.logprobs is not None:
        logprobs = logprobs_body(answer.logprobs, hide_tokens=answer.redacted)
    return {
        "index": answer.index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": answer.finish_reason,
    }


def logprobs_body(entries: Sequence[TextLogprob], *, hide_tokens: bool) -> dict[str, Any]:
    """OpenAI's `logprobs` object. With `hide_tokens` (the output checks changed the
    answer) the tokens' texts are left out, since they would show what was redacted."""
    return {"content": [_logprob(entry, hide_tokens) for entry in entries], "refusal": None}


def _logprob(entry: TextLogprob, hide_tokens: bool) -> dict[str, Any]:
    token = "" if hide_tokens else entry.token
    top = [] if hide_tokens else entry.top
    return {
        "token": token,
        "logprob": entry.logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [
            {"token": text, "logprob": value, "bytes": list(text.encode())} for text, value in top
        ],
    }


def chunk_body(
    chat: PreparedChat,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    *,
    with_usage_field: bool = False,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": chat.completion_id,
        "object": "chat.completion.chunk",
        "created": chat.created,
        "model": chat.model,
        "choices": [
            {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        ],
    }
    if with_usage_field:
        body["usage"] = None
    return body


def usage_chunk_body(chat: PreparedChat, answer: Answer) -> dict[str, Any]:
    return {
        "id": chat.completion_id,
        "object": "chat.completion.chunk",
        "created": chat.created,
        "model": chat.model,
        "choices": [],
        "usage": usage(answer.prompt_tokens, answer.completion_tokens, answer.cached_prompt_tokens),
    }


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
