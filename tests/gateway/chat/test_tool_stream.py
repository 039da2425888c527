"""The incremental tool-call parser: same calls whatever the chunking, text passed through
with only a tag's beginning held back, broken calls reported, and deltas that the official
openai client assembles back into the calls."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import (
    ChatCompletionStreamState,
    FunctionToolCallArgumentsDoneEvent,
)
from openai.types.chat import ChatCompletionChunk, ChatCompletionToolParam
from pydantic import BaseModel

from gateway.chat.tool_stream import (
    ArgumentsPiece,
    CallEnded,
    CallFailed,
    CallStarted,
    TextPiece,
    ToolCallStream,
    ToolStreamEvent,
    tool_call_delta,
)

TRICKY_ARGUMENTS: dict[str, Any] = {
    "query": 'say "hi" } ] { [ \\ </tool_call> <tool_call> \\"',
    "filters": {"tags": ["a", {"deep": {"deeper": [[], {}]}}], "empty": {}},
    "limit": 3,
    "ratio": -1.5e-3,
    "flag": None,
    "unicode": "São Paulo \u2603 \\u0041",
}


def counting_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter):024x}"


def call_text(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def run(chunks: Iterable[str]) -> list[ToolStreamEvent]:
    stream = ToolCallStream(new_id=counting_ids())
    events: list[ToolStreamEvent] = []
    for chunk in chunks:
        events.extend(stream.feed(chunk))
    return events + stream.close()


def split(text: str, cuts: Iterable[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def merged(events: list[ToolStreamEvent]) -> list[ToolStreamEvent]:
    """Adjacent text and same-call argument pieces joined: what chunking may not change."""
    out: list[ToolStreamEvent] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextPiece) and isinstance(last, TextPiece):
            out[-1] = TextPiece(last.text + event.text)
        elif (
            isinstance(event, ArgumentsPiece)
            and isinstance(last, ArgumentsPiece)
            and last.index == event.index
        ):
            out[-1] = ArgumentsPiece(event.index, last.fragment + event.fragment)
        else:
            out.append(event)
    return out


@dataclass
class Assembled:
    text: str = ""
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # id, name, arguments
    ended: dict[int, str] = field(default_factory=dict)
    failed: list[CallFailed] = field(default_factory=list)


def assemble(events: list[ToolStreamEvent]) -> Assembled:
    result = Assembled()
    for event in events:
        match event:
            case TextPiece(text=text):
                result.text += text
            case CallStarted(index=index, call_id=call_id, name=name):
                assert index == len(result.calls)
                result.calls.append((call_id, name, ""))
            case ArgumentsPiece(index=index, fragment=fragment):
                call_id, name, arguments = result.calls[index]
                result.calls[index] = (call_id, name, arguments + fragment)
            case CallEnded(index=index, arguments=arguments):
                result.ended[index] = arguments
            case CallFailed():
                result.failed.append(event)
    return result


def test_whole_text_and_one_character_at_a_time_give_the_same_events() -> None:
    arguments = json.dumps(TRICKY_ARGUMENTS)
    text = "Checking two things.\n" + call_text("search", arguments) + "\n" + call_text("f", "{}")

    whole = run([text])
    by_character = run(text)

    assert merged(by_character) == merged(whole)
    assert merged(whole) == [
        TextPiece("Checking two things.\n"),
        CallStarted(0, f"call_{0:024x}", "search"),
        ArgumentsPiece(0, arguments),
        CallEnded(0, arguments),
        CallStarted(1, f"call_{1:024x}", "f"),
        ArgumentsPiece(1, "{}"),
        CallEnded(1, "{}"),
    ]


def test_two_parallel_calls_drop_the_whitespace_between_them() -> None:
    text = (
        call_text("get_weather", '{"city": "Paris"}')
        + "\n \n"
        + call_text("get_time", '{"zone": "CET"}')
        + "\n"
    )
    result = assemble(run(text))

    assert result.text == ""
    assert [(name, args) for _, name, args in result.calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", '{"zone": "CET"}'),
    ]
    assert result.ended == {0: '{"city": "Paris"}', 1: '{"zone": "CET"}'}
    assert len({call_id for call_id, _, _ in result.calls}) == 2
    assert not result.failed


def test_ids_look_like_openai_call_ids() -> None:
    stream = ToolCallStream()
    events = stream.feed(call_text("a", "{}") + call_text("b", "{}")) + stream.close()
    ids = [e.call_id for e in events if isinstance(e, CallStarted)]
    assert len(set(ids)) == 2
    for call_id in ids:
        assert call_id.startswith("call_") and len(call_id) == 29
        int(call_id.removeprefix("call_"), 16)


def test_text_then_a_call() -> None:
    text = "Let me look that up.\n" + call_text("lookup", '{"id": 7}')
    stream = ToolCallStream(new_id=counting_ids())

    first = stream.feed(text[:25])
    assert first == [TextPiece("Let me look that up.\n")]  # the tag's beginning is held
    rest = stream.feed(text[25:]) + stream.close()
    result = assemble(first + rest)
    assert result.text == "Let me look that up.\n"
    assert result.calls == [(f"call_{0:024x}", "lookup", '{"id": 7}')]


def test_text_only_holds_back_just_a_tag_beginning_and_releases_it() -> None:
    stream = ToolCallStream()

    assert stream.feed("Use a <b> tag, 1 < 2, and the <tool_") == [
        TextPiece("Use a <b> tag, 1 < 2, and the ")
    ]
    assert stream.feed("box") == [TextPiece("<tool_box")]
    assert stream.feed(" or </tool_call> <tool_call") == [TextPiece(" or </tool_call> ")]
    assert stream.close() == [TextPiece("<tool_call")]


def test_text_only_leading_whitespace_is_released_with_the_text() -> None:
    assert merged(run("\n  Hi <")) == [TextPiece("\n  Hi <")]
    assert merged(run(" \n ")) == [TextPiece(" \n ")]


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(
        st.sampled_from(["<", "tool", "_", "call", ">", "</", "/", "a", " ", "\n", "{", '"'])
    ),
    cuts=st.lists(st.integers(min_value=0)),
)
def test_text_without_a_tag_comes_out_unchanged_whatever_the_chunks(
    pieces: list[str], cuts: list[int]
) -> None:
    text = "".join(pieces)
    if "<tool_call>" in text:
        return
    events = run(split(text, cuts))
    assert all(isinstance(e, TextPiece) for e in events)
    assert "".join(e.text for e in events if isinstance(e, TextPiece)) == text


def test_the_name_is_announced_as_soon_as_its_string_closes() -> None:
    stream = ToolCallStream(new_id=counting_ids())
    assert stream.feed('<tool_call>\n{"name": "get_weath') == []
    assert stream.feed('er"') == [CallStarted(0, f"call_{0:024x}", "get_weather")]
    assert stream.feed(', "arguments": ') == []
    assert stream.feed('{"city": ') == [ArgumentsPiece(0, '{"city": ')]
    assert stream.feed('"Oslo"}}') == [
        ArgumentsPiece(0, '"Oslo"}'),
        CallEnded(0, '{"city": "Oslo"}'),
    ]


@pytest.mark.parametrize(
    "arguments",
    [
        json.dumps(TRICKY_ARGUMENTS),
        json.dumps(TRICKY_ARGUMENTS, separators=(",", ":")),
        json.dumps(TRICKY_ARGUMENTS, indent=2),
        json.dumps(TRICKY_ARGUMENTS, ensure_ascii=False),
        '{"a": "\\u007d\\"}", "b": [{"c": "]"}, "\\\\"]}',
    ],
    ids=["spaced", "compact", "indented", "utf8", "escapes"],
)
def test_arguments_with_nesting_and_tricky_strings_are_forwarded_exactly(
    arguments: str,
) -> None:
    for chunks in ([call_text("search", arguments)], call_text("search", arguments)):
        events = run(chunks)
        result = assemble(events)
        assert result.calls[0][1:] == ("search", arguments)
        assert result.ended == {0: arguments}
        assert json.loads(result.ended[0]) == json.loads(arguments)
        assert not result.failed and result.text == ""


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(
    arguments=st.dictionaries(st.text(max_size=8), _JSON_VALUES, max_size=5),
    indent=st.sampled_from([None, 0, 2]),
    text=st.sampled_from(["", "Sure.\n", "a < b <tool_ "]),
    cuts=st.lists(st.integers(min_value=0), max_size=40),
)
def test_any_json_object_reassembles_whatever_the_chunks(
    arguments: dict[str, Any], indent: int | None, text: str, cuts: list[int]
) -> None:
    encoded = json.dumps(arguments, indent=indent)
    answer = text + call_text("f", encoded) + "\n" + call_text("g", '{"x": [1]}')

    events = run(split(answer, cuts))

    assert merged(events) == merged(run([answer]))
    result = assemble(events)
    assert result.text == text
    assert [c[1:] for c in result.calls] == [("f", encoded), ("g", '{"x": [1]}')]
    assert json.loads(result.ended[0]) == arguments


def test_tolerated_deviations() -> None:
    text = (
        '<tool_call>{ "name" :"a",\n  "parameters":{"x":1} }</tool_call>'
        '<tool_call>{"name": "b", "arguments": {"y": 2}}\n'  # no closing tag before the next
        '<tool_call>\n{"name": "c", "arguments": {"z": 3}}'  # none at the end either
    )
    result = assemble(run(text))
    assert [c[1:] for c in result.calls] == [("a", '{"x":1}'), ("b", '{"y": 2}'), ("c", '{"z": 3}')]
    assert len(result.ended) == 3 and not result.failed and result.text == ""


def test_a_call_without_closing_tag_is_ended_by_its_arguments_and_close() -> None:
    stream = ToolCallStream(new_id=counting_ids())
    events = stream.feed('<tool_call>\n{"name": "f", "arguments": {"q": "x"}')
    assert events[-1] == CallEnded(0, '{"q": "x"}')
    assert stream.close() == []


def test_text_after_a_closed_call_is_text() -> None:
    result = assemble(run(call_text("f", "{}") + "\n\nDone."))
    assert result.text == "\n\nDone."
    assert result.ended == {0: "{}"}


def test_a_header_that_is_not_json_is_one_failure_with_its_text() -> None:
    broken = "<tool_call>\nget_weather(city='Paris')\n</tool_call>"
    events = run(broken + "\nSorry." + call_text("f", "{}"))

    assert not any(isinstance(e, CallStarted) and e.name != "f" for e in events)
    result = assemble(events)
    assert len(result.failed) == 1
    assert result.failed[0].index is None
    assert result.failed[0].text == broken
    assert "expected '{'" in result.failed[0].reason
    assert result.text == "\nSorry."
    assert result.calls == [(f"call_{0:024x}", "f", "{}")]  # index 0 was not used up


@pytest.mark.parametrize(
    ("arguments", "reason", "sent"),
    [
        ("[1, 2]", "not a JSON object", ""),
        ('"{\\"a\\": 1}"', "not a JSON object", ""),
        ('{"a": 1,}', "not valid JSON", '{"a": 1,}'),
        ('{"a": NaN}', "not valid JSON", '{"a": NaN}'),
        ('{"a": [1}', "brackets do not match", '{"a": [1'),
    ],
)
def test_broken_arguments_fail_the_call_after_its_name(
    arguments: str, reason: str, sent: str
) -> None:
    text = call_text("f", arguments)
    for chunks in ([text], text):
        result = assemble(run([*chunks, call_text("g", "{}")]))
        assert result.calls[0][1:] == ("f", sent)
        assert [(f.index, f.text) for f in result.failed] == [(0, text)]
        assert reason in result.failed[0].reason
        assert 0 not in result.ended
        assert result.calls[1][1:] == ("g", "{}") and result.ended == {1: "{}"}


@pytest.mark.parametrize(
    ("text", "index", "reason"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"a": [1, ', 0, "inside the call's arguments"),
        ('<tool_call>\n{"name": "f", "argu', 0, "inside the call's header"),
        ('<tool_call>\n{"na', None, "inside the call's header"),
        ("<tool_call>\nI will call a tool </tool_", None, "expected '{'"),
    ],
)
def test_an_answer_ending_inside_a_call_fails_it(text: str, index: int | None, reason: str) -> None:
    failed = [e for e in run(text) if isinstance(e, CallFailed)]
    assert [(f.index, f.text) for f in failed] == [(index, text)]
    assert reason in failed[0].reason


def test_header_strings_are_bounded() -> None:
    failed = [e for e in run('<tool_call>{"name": "' + "x" * 10_000) if isinstance(e, CallFailed)]
    assert len(failed) == 1 and failed[0].index is None
    assert "too long" in failed[0].reason


def test_feed_after_close_is_refused() -> None:
    stream = ToolCallStream()
    stream.close()
    with pytest.raises(RuntimeError):
        stream.feed("x")


def test_deltas_have_openai_shape() -> None:
    assert tool_call_delta(TextPiece("hi")) == {"content": "hi"}
    assert tool_call_delta(CallStarted(1, "call_x", "f")) == {
        "tool_calls": [
            {
                "index": 1,
                "id": "call_x",
                "type": "function",
                "function": {"name": "f", "arguments": ""},
            }
        ]
    }
    assert tool_call_delta(ArgumentsPiece(1, '{"a"')) == {
        "tool_calls": [{"index": 1, "function": {"arguments": '{"a"'}}]
    }
    assert tool_call_delta(CallEnded(1, "{}")) is None
    assert tool_call_delta(CallFailed(None, "<tool_call>x", "why")) is None


class GetWeather(BaseModel):
    city: str
    unit: Literal["c", "f"]
    days: list[int]


SEARCH_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        "strict": True,
    },
}


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "smollm2",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
    )


@pytest.mark.parametrize("chunk_size", [1, 3, 10_000])
def test_the_openai_client_assembles_our_deltas(chunk_size: int) -> None:
    weather = GetWeather(city='São "Paulo" } </tool_call> \\', unit="c", days=[1, 2])
    search = {"query": TRICKY_ARGUMENTS["query"], "filters": TRICKY_ARGUMENTS["filters"]}
    answer = (
        "Two calls:\n"
        + call_text("GetWeather", weather.model_dump_json())
        + "\n"
        + call_text("search", json.dumps(search, indent=1))
    )
    state: ChatCompletionStreamState[None] = ChatCompletionStreamState(
        input_tools=[openai.pydantic_function_tool(GetWeather), SEARCH_TOOL]
    )
    client_events: list[object] = []
    stream = ToolCallStream()
    client_events.extend(state.handle_chunk(chunk({"role": "assistant", "content": ""})))
    pieces = [answer[i : i + chunk_size] for i in range(0, len(answer), chunk_size)]
    events = [e for piece in pieces for e in stream.feed(piece)] + stream.close()
    for event in events:
        delta = tool_call_delta(event)
        if delta is not None:
            client_events.extend(state.handle_chunk(chunk(delta)))
    client_events.extend(state.handle_chunk(chunk({}, finish_reason="tool_calls")))

    message = state.get_final_completion().choices[0].message
    started = [e for e in events if isinstance(e, CallStarted)]
    assert message.content == "Two calls:\n"
    assert message.tool_calls is not None and len(message.tool_calls) == 2
    first, second = message.tool_calls
    assert (first.id, first.function.name) == (started[0].call_id, "GetWeather")
    assert (second.id, second.function.name) == (started[1].call_id, "search")
    assert json.loads(first.function.arguments) == weather.model_dump()
    assert first.function.parsed_arguments == weather
    assert json.loads(second.function.arguments) == search
    assert second.function.parsed_arguments == search
    done = [e for e in client_events if isinstance(e, FunctionToolCallArgumentsDoneEvent)]
    assert [(e.index, e.name) for e in done] == [(0, "GetWeather"), (1, "search")]
