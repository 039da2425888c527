"""OpenAI's response and stream-chunk objects for chat completions."""

from __future__ import annotations

import json
from typing import Any

from gateway.chat.service import Answer, PreparedChat


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(chat: PreparedChat, answer: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    return {
        "id": chat.completion_id,
        "object": "chat.completion",
        "created": chat.created,
        "model": chat.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": usage(answer.prompt_tokens, answer.completion_tokens),
        "citations": chat.citations(),
    }


def chunk_body(
    chat: PreparedChat,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    *,
    with_usage_field: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": chat.completion_id,
        "object": "chat.completion.chunk",
        "created": chat.created,
        "model": chat.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
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
        "usage": usage(answer.prompt_tokens, answer.completion_tokens),
    }


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
