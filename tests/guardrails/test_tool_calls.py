from __future__ import annotations

import json

import pytest

from guardrails.tool_calls import (
    ParsedToolCall,
    ToolSpec,
    extract_tool_calls,
    tool_prompt,
    validate_tool_calls,
)
from guardrails.verdict import CheckMode

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)
TOOLS = [WEATHER]


def _one(text: str) -> ParsedToolCall:
    calls = extract_tool_calls(text)
    assert calls is not None and len(calls) == 1
    return calls[0]


def test_valid_call_is_allowed() -> None:
    text = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call>'
    )
    call = _one(text)
    assert call.name == "get_weather"
    assert call.arguments == {"city": "Oslo", "days": 2}
    assert json.loads(call.arguments_json) == {"city": "Oslo", "days": 2}
    check = validate_tool_calls([call], TOOLS, "enforce")
    assert check.errors == []
    assert check.verdict.action == "allow"
    assert check.verdict.check == "tool_call_schema"


def test_missing_closing_tag_and_several_calls() -> None:
    text = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}'
    )
    calls = extract_tool_calls(text)
    assert calls is not None
    assert [c.arguments for c in calls] == [{"city": "Oslo"}, {"city": "Rome"}]


def test_bare_json_object_is_a_call() -> None:
    call = _one('  {"name": "get_weather", "arguments": {"city": "Oslo"}}  ')
    assert call.name == "get_weather"
    assert call.parse_error is None


def test_no_call_returns_none() -> None:
    assert extract_tool_calls("The weather in Oslo is sunny.") is None
    assert extract_tool_calls('{"name": "Bob", "age": 3}') is None


def test_unknown_tool_is_blocked() -> None:
    call = _one('<tool_call>{"name": "delete_db", "arguments": {}}</tool_call>')
    check = validate_tool_calls([call], TOOLS, "enforce")
    assert check.verdict.action == "block"
    assert check.verdict.blocks
    assert "unknown tool 'delete_db'" in check.errors[0]


def test_wrong_type_is_blocked_with_json_path() -> None:
    call = _one('<tool_call>{"name": "get_weather", "arguments": {"city": 42}}</tool_call>')
    check = validate_tool_calls([call], TOOLS, "enforce")
    assert check.verdict.action == "block"
    assert len(check.errors) == 1
    assert "$.city" in check.errors[0]
    assert "is not of type 'string'" in check.errors[0]
    assert check.verdict.evidence == tuple(check.errors)


def test_missing_required_field_is_blocked() -> None:
    call = _one('<tool_call>{"name": "get_weather", "arguments": {"days": 3}}</tool_call>')
    check = validate_tool_calls([call], TOOLS, "enforce")
    assert check.verdict.action == "block"
    assert "'city' is a required property" in check.errors[0]


def test_malformed_json_is_blocked() -> None:
    call = _one('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"</tool_call>')
    assert call.parse_error is not None
    assert call.arguments is None
    check = validate_tool_calls([call], TOOLS, "enforce")
    assert check.verdict.action == "block"
    assert "invalid JSON" in check.errors[0]


def test_string_encoded_arguments_are_parsed() -> None:
    call = _one('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}')
    assert call.arguments == {"city": "Oslo"}


@pytest.mark.parametrize("mode", ["warn", "dryrun"])
def test_non_enforce_modes_report_without_blocking(mode: CheckMode) -> None:
    call = _one('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    check = validate_tool_calls([call], TOOLS, mode)
    assert check.verdict.action == "block"
    assert not check.verdict.blocks


def test_tool_prompt_lists_tools_and_format() -> None:
    prompt = tool_prompt(TOOLS)
    assert '"name": "get_weather"' in prompt
    assert "Current weather for a city" in prompt
    assert "<tool_call>" in prompt and "</tool_call>" in prompt
    tools_block = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(tools_block)["function"]["parameters"] == WEATHER.parameters


BAD_ARGUMENTS = [
    {},
    {"city": 7},
    {"city": None},
    {"city": ["Oslo"]},
    {"city": "Oslo", "days": 0},
    {"city": "Oslo", "days": "3"},
    {"city": "Oslo", "days": 2.5},
    {"city": "Oslo", "unit": "celsius"},
    {"town": "Oslo"},
]


@pytest.mark.parametrize("arguments", BAD_ARGUMENTS)
@pytest.mark.parametrize("name", ["get_weather", "get_wether", "delete_all_records", ""])
def test_schema_breaking_or_undeclared_calls_are_never_valid(
    name: str, arguments: dict[str, object]
) -> None:
    text = f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
    calls = extract_tool_calls(text)
    assert calls is not None
    check = validate_tool_calls(calls, TOOLS, "enforce")
    assert check.verdict.blocks and check.errors


@pytest.mark.parametrize("name", ["get_wether", "delete_all_records"])
def test_undeclared_tool_with_valid_looking_arguments_is_blocked(name: str) -> None:
    calls = [ParsedToolCall(name, '{"city": "Oslo"}', {"city": "Oslo"}, None)]
    assert validate_tool_calls(calls, TOOLS, "enforce").verdict.blocks
