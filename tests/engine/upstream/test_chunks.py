"""Reading streamed chunks: text, counts until usage arrives, finish reasons, bad shapes."""

from __future__ import annotations

import pytest

from engine.upstream.chunks import AnswerReader, UpstreamStreamError
from engine.upstream.sse import DONE, MalformedStream, parse_line


def test_tokens_are_counted_until_the_usage_says() -> None:
    reader = AnswerReader(is_chat=True)
    reader.read({"choices": [{"delta": {"role": "assistant", "content": None}}]})
    assert reader.completion_tokens == 0
    reader.read({"choices": [{"delta": {"content": "Hi"}}]})
    reader.read({"choices": [{"delta": {"content": " there"}, "finish_reason": "tool_calls"}]})
    assert reader.completion_tokens == 2 and reader.finish_reason == "stop"
    details = {"cached_tokens": 4}
    usage = {"prompt_tokens": 9, "completion_tokens": 3, "prompt_tokens_details": details}
    reader.read({"choices": [], "usage": usage})
    assert (reader.prompt_tokens, reader.completion_tokens) == (9, 3)
    assert reader.cached_prompt_tokens == 4


def test_legacy_completion_logprobs_are_read() -> None:
    reader = AnswerReader(is_chat=False)
    chunk = reader.read(
        {
            "choices": [
                {
                    "text": " Paris",
                    "logprobs": {
                        "tokens": [" Paris"],
                        "token_logprobs": [-0.1],
                        "top_logprobs": [{" Paris": -0.1, " Lyon": -3.0}],
                    },
                    "finish_reason": "length",
                }
            ]
        }
    )
    assert chunk.text == " Paris" and chunk.logprobs[0].top == ((" Paris", -0.1), (" Lyon", -3.0))
    assert reader.finish_reason == "length"


def test_sse_lines() -> None:
    assert parse_line("") is None and parse_line(": keep-alive") is None
    assert parse_line("event: message") is None
    assert parse_line("data: [DONE]") == DONE
    assert parse_line('data: {"a": 1}') == {"a": 1}
    for bad in ("data: {oops", "data: [1, 2]", "garbage"):
        with pytest.raises(MalformedStream):
            parse_line(bad)


def test_an_error_object_and_a_shapeless_chunk_are_errors() -> None:
    reader = AnswerReader(is_chat=True)
    with pytest.raises(UpstreamStreamError, match="out of memory"):
        reader.read({"error": {"message": "out of memory"}})
    with pytest.raises(MalformedStream):
        reader.read({"choices": "nope"})
