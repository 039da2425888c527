"""OpenAI's `text_completion` objects: the whole response and its stream chunks."""

from __future__ import annotations

from typing import Any

from gateway.chat.openai_format import usage
from gateway.completions.service import ChoiceResult, PreparedCompletion


def completion_body(prepared: PreparedCompletion, results: list[ChoiceResult]) -> dict[str, Any]:
    """The whole response; with `echo` each choice's text starts with its prompt."""
    prompts = {choice.index: choice.prompt for choice in prepared.choices}
    choices = [
        choice_body(
            result.index,
            (prompts[result.index] if prepared.echo else "") + result.text,
            result.logprobs,
            result.finish_reason,
        )
        for result in results
    ]
    return _envelope(prepared, choices) | {"usage": _usage(prepared)}


def chunk_body(
    prepared: PreparedCompletion, choices: list[dict[str, Any]], *, with_usage_field: bool
) -> dict[str, Any]:
    body = _envelope(prepared, choices)
    return body | {"usage": None} if with_usage_field else body


def usage_chunk_body(prepared: PreparedCompletion) -> dict[str, Any]:
    """The last chunk when `stream_options.include_usage` is set: no choices, the usage."""
    return _envelope(prepared, []) | {"usage": _usage(prepared)}


def choice_body(
    index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}


def _envelope(prepared: PreparedCompletion, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": prepared.completion_id,
        "object": "text_completion",
        "created": prepared.created,
        "model": prepared.model,
        "choices": choices,
    }


def _usage(prepared: PreparedCompletion) -> dict[str, Any]:
    return usage(prepared.prompt_tokens, prepared.completion_tokens, prepared.cached_prompt_tokens)
