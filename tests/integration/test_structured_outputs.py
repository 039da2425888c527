"""Structured outputs and tool calls through the official `openai` client against a live
server: constrained decoding makes every answer valid, whatever the temperature."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.integration.conftest import LiveServer
from tests.integration.structured_schemas import SCHEMA_CASES

pytestmark = pytest.mark.slow

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
STOCK: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_stock_price",
        "description": "The latest price of a stock.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}},
            "required": ["ticker"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, STOCK]
TOOL_QUESTIONS = [
    "What is the weather in Paris?",
    "How is Apple's stock doing?",
    "Tell me a joke.",
    "Is it raining in Berlin right now?",
]


def _schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_every_schema_answer_validates_at_temperature_0_and_1(client: OpenAI) -> None:
    runs = [
        (name, question, schema, temperature, seed)
        for name, question, schema in SCHEMA_CASES
        for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2), (1.0, 3))
    ]

    def ask(run: tuple[str, str, dict[str, Any], float, int | None]) -> tuple[str, Any]:
        name, question, schema, temperature, seed = run
        response = client.chat.completions.create(
            model="",
            messages=[{"role": "user", "content": question}],
            response_format=_schema_format(name, schema),  # type: ignore[arg-type]
            temperature=temperature,
            seed=seed,
            max_tokens=300,
        )
        return name, response.choices[0]

    assert len(SCHEMA_CASES) >= 20
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(ask, runs))
    schemas = {name: schema for name, _, schema in SCHEMA_CASES}
    finished = 0
    for name, choice in results:
        if choice.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(choice.message.content), schemas[name])
        elif choice.finish_reason == "content_filter":
            # An answer the output checks changed so that it no longer meets the schema
            # is withheld, with a refusal naming the path (gateway/chat/answer_check.py).
            assert choice.message.refusal and choice.message.content is None, (name, choice)
        else:
            assert choice.finish_reason == "length", (name, choice.finish_reason)
    assert finished >= 0.95 * len(results), f"{finished} of {len(results)} finished"


def test_json_object_answers_are_json_objects(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "Describe a dog in JSON."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=200,
    )
    choice = response.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content or ""), dict)
    else:
        assert choice.finish_reason == "length"


def test_a_cut_schema_answer_says_length(client: OpenAI) -> None:
    name, question, schema = SCHEMA_CASES[4]
    response = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": question}],
        response_format=_schema_format(name, schema),  # type: ignore[arg-type]
        max_tokens=6,
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 6


class CalendarEvent(BaseModel):
    name: str
    day: int
    participants: list[str]


def test_parse_returns_pydantic_objects(client: OpenAI) -> None:
    completion = client.chat.completions.parse(
        model="",
        messages=[{"role": "user", "content": "Alice and Bob meet for lunch on day 12."}],
        response_format=CalendarEvent,
        temperature=0,
        max_tokens=200,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, CalendarEvent)


def _calls(response: Any) -> list[Any]:
    return list(response.choices[0].message.tool_calls or [])


def _assert_valid_call(call: Any, tools: list[dict[str, Any]]) -> None:
    spec = next(t for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), spec["function"]["parameters"])
    assert call.type == "function" and call.id.startswith("call_")


def test_required_and_named_tool_choice_always_call_the_right_tool(client: OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_stock_price"}}
    for choice in ("required", named):
        for question in TOOL_QUESTIONS:
            response = client.chat.completions.create(
                model="",
                messages=[{"role": "user", "content": question}],
                tools=TOOLS,  # type: ignore[arg-type]
                tool_choice=choice,  # type: ignore[arg-type]
                max_tokens=120,
            )
            # A small model may go on calling until max_tokens: the calls it completed
            # come back, with `length`.
            assert response.choices[0].finish_reason in ("tool_calls", "length")
            calls = _calls(response)
            assert calls
            for call in calls:
                _assert_valid_call(call, TOOLS)
                if choice is named:
                    assert call.function.name == "get_stock_price"


def test_auto_calls_are_valid_and_none_makes_no_call(client: OpenAI) -> None:
    for question in TOOL_QUESTIONS:
        auto = client.chat.completions.create(
            model="",
            messages=[{"role": "user", "content": question}],
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="auto",
            temperature=0,
            max_tokens=120,
        )
        for call in _calls(auto):
            _assert_valid_call(call, TOOLS)
        none = client.chat.completions.create(
            model="",
            messages=[{"role": "user", "content": question}],
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="none",
            max_tokens=40,
        )
        assert not _calls(none) and none.choices[0].finish_reason in ("stop", "length")


def test_one_call_without_parallel_tool_calls(client: OpenAI) -> None:
    response = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=4,
        max_tokens=200,
    )
    assert len(_calls(response)) == 1


def test_a_streamed_call_cut_by_max_tokens_ends_with_length(client: OpenAI) -> None:
    """The call's start went out; the cut is not a failed call but a `length` answer."""
    stream = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "What is the weather in Lisbon?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        max_tokens=24,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]  # an error event would raise here
    assert any(c.choices[0].delta.tool_calls for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_streamed_calls_assemble_with_the_client_helpers(client: OpenAI) -> None:
    with client.chat.completions.stream(
        model="",
        messages=[{"role": "user", "content": "What is the weather in Lisbon?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        # Greedy, so the call is the same every run and fits the budget (sampled, it
        # sometimes ran past it).
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    chunks = [e.chunk for e in events if e.type == "chunk" and e.chunk.choices]
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    # Per call: the id and the name first, with no arguments; then the arguments.
    for index in {d.index for d in deltas}:
        first, *rest = [d for d in deltas if d.index == index]
        assert first.id and first.function.name == "GetWeather"  # type: ignore[union-attr]
        assert first.function.arguments == ""  # type: ignore[union-attr]
        assert rest and all(d.id is None and d.function.arguments for d in rest)  # type: ignore[union-attr]
    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert final.choices[0].finish_reason == "tool_calls"


class GetWeather(BaseModel):
    city: str
    unit: str


def test_tool_results_are_fed_back_in_the_models_format(
    client: OpenAI, live_server: LiveServer
) -> None:
    arguments = json.dumps({"city": "Paris", "unit": "celsius"})
    response = client.chat.completions.with_raw_response.create(
        model="",
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
        ],
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=40,
    )
    prompt = live_server.engine.received[response.headers["x-request-id"]]
    assistant, tool = prompt[-2], prompt[-1]
    assert assistant.content == (
        '<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    )
    assert tool.role == "tool"
    assert json.loads(tool.content.split("\n")[1]) == {
        "name": "get_weather",
        "content": "18 degrees and sunny",
    }
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="",
            messages=[
                {"role": "user", "content": "Hi"},
                {"role": "tool", "tool_call_id": "call_9", "content": "x"},
            ],
            max_tokens=5,
        )
    assert refused.value.body["param"] == "messages.1.tool_call_id"  # type: ignore[index]


def test_the_audit_record_keeps_the_schema_hash(client: OpenAI, live_server: LiveServer) -> None:
    name, question, schema = SCHEMA_CASES[0]
    raw = client.chat.completions.with_raw_response.create(
        model="",
        messages=[{"role": "user", "content": question}],
        response_format=_schema_format(name, schema),  # type: ignore[arg-type]
        max_tokens=60,
    )
    (row,) = live_server.audit_rows(raw.headers["x-request-id"])
    assert row.details["constrained"] is True
    assert row.details["constraint"] == "json_schema"
    assert len(row.details["constraint_sha256"]) == 64
    plain = client.chat.completions.with_raw_response.create(
        model="", messages=[{"role": "user", "content": "Hi"}], max_tokens=5
    )
    (row,) = live_server.audit_rows(plain.headers["x-request-id"])
    assert row.details["constrained"] is False


def test_pii_in_a_json_value_is_redacted_and_a_broken_schema_is_withheld(
    client: OpenAI,
) -> None:
    free = {
        "type": "object",
        "properties": {"contact": {"type": "string", "maxLength": 40}},
        "required": ["contact"],
        "additionalProperties": False,
    }
    question = "Write the support contact: the address is help.desk@acme-support.com"
    response = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": question}],
        response_format=_schema_format("contact", free),  # type: ignore[arg-type]
        temperature=0,
        max_tokens=60,
    )
    content = response.choices[0].message.content or ""
    assert "help.desk@acme-support.com" not in content
    jsonschema.validate(json.loads(content), free)
    strict = {
        "type": "object",
        "properties": {
            "email": {"type": "string", "pattern": "^[a-z]{2,8}@[a-z]{3,8}\\.com$"},
        },
        "required": ["email"],
        "additionalProperties": False,
    }
    withheld = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "Make up an email address for Bob."}],
        response_format=_schema_format("email", strict),  # type: ignore[arg-type]
        temperature=0,
        max_tokens=60,
    )
    choice = withheld.choices[0]
    assert choice.finish_reason == "content_filter"
    assert choice.message.content is None
    assert choice.message.refusal and "no longer matches the schema" in choice.message.refusal


HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("depth_300", {"type": "object", "properties": {"a": {}}}),  # filled in below
    (
        "enum_100k",
        {"type": "object", "properties": {"v": {"enum": [f"v{i}" for i in range(100_000)]}}},
    ),
    (
        "recursive_ref",
        {
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node",
        },
    ),
    (
        "catastrophic_pattern",
        {
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}},
            "required": ["s"],
        },
    ),
    ("invalid_type", {"type": 12}),
    ("huge_schema", {"type": "object", "description": "x" * 1_000_000}),
    ("remote_ref", {"$ref": "https://example.com/schema.json"}),
    ("unsupported_keyword", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
    ("huge_min_items", {"type": "array", "items": {"type": "integer"}, "minItems": 1_000_000_000}),
    (
        "nested_huge_enum",
        {
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b": {"enum": list(range(50_000))}}}
            },
        },
    ),
    (
        "hostile_pattern_properties",
        {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "string"}}},
    ),
]


def _deep(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


HOSTILE[0] = ("depth_300", _deep(300))


@pytest.mark.parametrize(("name", "schema"), HOSTILE, ids=[name for name, _ in HOSTILE])
def test_hostile_schemas_are_answered_within_a_second(
    client: OpenAI, live_server: LiveServer, name: str, schema: dict[str, Any]
) -> None:
    started = time.perf_counter()
    try:
        response = client.chat.completions.create(
            model="",
            messages=[{"role": "user", "content": "Answer."}],
            response_format=_schema_format(name, schema),  # type: ignore[arg-type]
            max_tokens=1,
        )
    except openai.APIStatusError as refused:
        assert 400 <= refused.status_code < 500
        body = refused.body
        assert isinstance(body, dict) and body["message"] and body["type"]
    else:
        assert response.choices[0].finish_reason in ("length", "stop")
    assert time.perf_counter() - started < 1.0 + _upload_seconds(schema)
    # The server keeps serving everyone else.
    ok = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert ok.choices[0].finish_reason in ("length", "stop")


def _upload_seconds(schema: dict[str, Any]) -> float:
    """Sending and parsing a megabyte of JSON on this machine is not the schema's cost."""
    return len(json.dumps(schema)) / 2_000_000


def test_a_streamed_json_answer_is_held_once_redacted_and_withheld_if_broken(
    client: OpenAI,
) -> None:
    strict = {
        "type": "object",
        "properties": {
            "email": {"type": "string", "pattern": "^[a-z]{2,8}@[a-z]{3,8}\\.com$"},
        },
        "required": ["email"],
        "additionalProperties": False,
    }
    stream = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "Make up an email address for Bob."}],
        response_format=_schema_format("email", strict),  # type: ignore[arg-type]
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    received = ""
    with pytest.raises(openai.APIError, match="no longer matches the schema"):
        for chunk in stream:
            if chunk.choices:
                received += chunk.choices[0].delta.content or ""
    assert "@" not in received  # nothing past the redaction went out
