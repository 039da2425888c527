"""Tool calls written by the model: prompt section, extraction, and schema validation.

SmolLM2-Instruct writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; small
models also drop the closing tag or answer with the bare JSON object, so both are accepted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from guardrails.verdict import CheckMode, Verdict

CHECK_NAME = "tool_call_schema"
_OPEN_TAG = "<tool_call>"
_CLOSE_TAG = "</tool_call>"
_CODE_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the client declared; `parameters` is a JSON schema for its arguments."""

    name: str
    parameters: dict[str, Any]
    description: str = ""


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One call as the model wrote it; `arguments_json` is canonical JSON when it parsed."""

    name: str
    arguments_json: str
    arguments: Any | None
    parse_error: str | None


@dataclass(frozen=True, slots=True)
class ToolCallCheck:
    calls: list[ParsedToolCall]
    errors: list[str]
    verdict: Verdict


def tool_prompt(tools: Sequence[ToolSpec]) -> str:
    """System-prompt section listing the tools and the exact call format."""
    lines = [
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            },
            ensure_ascii=False,
        )
        for tool in tools
    ]
    return (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n" + "\n".join(lines) + "\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def extract_tool_calls(text: str) -> list[ParsedToolCall] | None:
    """Tool calls in a model answer; None when the answer holds no tool-call attempt."""
    if _OPEN_TAG in text:
        calls: list[ParsedToolCall] = []
        for chunk in text.split(_OPEN_TAG)[1:]:
            body = chunk.split(_CLOSE_TAG, 1)[0].strip()
            calls.extend(_parse_body(body))
        return calls
    stripped = text.strip()
    fenced = _CODE_FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    # A bare object counts only when it is unambiguously a call: valid JSON with both keys.
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError:
        return None
    if isinstance(obj, dict) and "name" in obj and "arguments" in obj:
        return [_from_object(obj)]
    return None


def validate_tool_calls(
    calls: Sequence[ParsedToolCall], tools: Sequence[ToolSpec], mode: CheckMode
) -> ToolCallCheck:
    """Each call must name a declared tool and carry arguments valid under its schema."""
    specs = {tool.name: tool for tool in tools}
    errors: list[str] = []
    for i, call in enumerate(calls):
        label = f"call {i} ({call.name or '?'})"
        if call.parse_error is not None:
            errors.append(f"{label}: {call.parse_error}")
            continue
        spec = specs.get(call.name)
        if spec is None:
            declared = ", ".join(sorted(specs)) or "none"
            errors.append(f"{label}: unknown tool {call.name!r} (declared: {declared})")
            continue
        if not isinstance(call.arguments, dict):
            errors.append(f"{label}: arguments must be a JSON object")
            continue
        try:
            Draft202012Validator.check_schema(spec.parameters)
        except SchemaError as exc:
            errors.append(f"{label}: tool's parameters schema is invalid: {exc.message}")
            continue
        validator = Draft202012Validator(spec.parameters)
        for error in sorted(validator.iter_errors(call.arguments), key=lambda e: e.json_path):
            errors.append(f"{label}: {error.json_path}: {error.message}")
    if errors:
        return ToolCallCheck(
            list(calls), errors, Verdict(CHECK_NAME, "block", 1.0, tuple(errors), mode)
        )
    return ToolCallCheck(list(calls), [], Verdict(CHECK_NAME, "allow", 0.0, (), mode))


def _parse_body(body: str) -> list[ParsedToolCall]:
    """Parse one `<tool_call>` body; trailing text after the JSON value is ignored."""
    try:
        obj, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        return [ParsedToolCall("", body, None, f"invalid JSON: {exc.msg} at char {exc.pos}")]
    if isinstance(obj, list):
        return [_from_object(item) for item in obj]
    return [_from_object(obj)]


def _from_object(obj: Any) -> ParsedToolCall:
    raw = json.dumps(obj, ensure_ascii=False)
    if not isinstance(obj, dict):
        return ParsedToolCall("", raw, None, "tool call must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ParsedToolCall("", raw, None, 'tool call has no "name" string')
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return ParsedToolCall(name, arguments, None, f"arguments are not valid JSON: {exc.msg}")
    if not isinstance(arguments, dict):
        args_json = json.dumps(arguments, ensure_ascii=False)
        return ParsedToolCall(name, args_json, None, "arguments must be a JSON object")
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False), arguments, None)
