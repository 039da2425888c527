"""What shape an answer must take: `response_format` and `tool_choice` as an engine
constraint, plus the line of the system prompt that tells the model about it.

Decoding is constrained so that the answer is valid by construction; the output stage
still validates it (the checks after the engine may change a value, and an upstream
engine may not constrain).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from engine import Constraint, Engine, UpstreamEngine
from gateway.chat.schemas import (
    ChatCompletionRequest,
    NamedToolChoice,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
)
from gateway.http.errors import ApiError
from guardrails import ToolSpec

ToolMode = Literal["none", "auto", "required"]
# Whitespace a tool call's arguments may hold between tokens: enough for readable JSON,
# too little for an answer to loop on blanks.
_ARGUMENT_WHITESPACE = 1


@dataclass(frozen=True, slots=True)
class OutputShape:
    """The constraint on the answer, and what the answer is checked against afterwards."""

    constraint: Constraint | None = None
    schema: dict[str, Any] | None = None  # the response_format schema an answer must meet
    json_answer: bool = False  # json_object or json_schema: the answer must be JSON
    tool_mode: ToolMode = "none"
    instruction: str = ""  # added to the system prompt
    # Whether the engine's decoding enforces `constraint`: an upstream server is asked to
    # (`response_format`) but may not, so its JSON answer is valid only once checked.
    enforced: bool = True

    def audit_details(self) -> dict[str, Any]:
        if self.constraint is None:
            return {"constrained": False}
        return {
            "constrained": True,
            "constraint": self.constraint.kind,
            "constraint_sha256": self.constraint.key,
        }


def output_shape(body: ChatCompletionRequest, tools: list[ToolSpec]) -> OutputShape:
    """The shape `body` asks for; 400 when `response_format` and `tool_choice` conflict."""
    mode = _tool_mode(body, tools)
    response = body.response_format
    wants_json = isinstance(response, ResponseFormatJsonObject | ResponseFormatJsonSchema)
    if mode == "auto" and wants_json:
        raise ApiError(
            400,
            "response_format json_object or json_schema together with tools is supported "
            "with tool_choice 'required', a named function, or 'none', not 'auto'.",
            param="response_format",
            code="unsupported_parameter",
        )
    if mode != "none":
        return OutputShape(
            tool_constraint(tools, body.tool_choice, body.parallel_tool_calls), None, False, mode
        )
    if isinstance(response, ResponseFormatJsonSchema):
        schema = response.json_schema.json_schema
        source = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        return OutputShape(
            Constraint("json_schema", source),
            schema,
            True,
            instruction="Answer with one JSON object that follows this JSON Schema:\n" + source,
        )
    if isinstance(response, ResponseFormatJsonObject):
        return OutputShape(
            Constraint("json_object"), None, True, instruction="Answer with one JSON object."
        )
    return OutputShape()


def shape_for(shape: OutputShape, engine: Engine) -> OutputShape:
    """`shape` as `engine` can enforce it. An upstream server takes JSON constraints (as
    `response_format`, not enforced here: the answer is checked before it is released) but
    no structural tag: its tool calls come unconstrained, from the tool prompt, and are
    validated afterwards as every call is."""
    if not isinstance(engine, UpstreamEngine):
        return shape
    constraint = shape.constraint
    if constraint and constraint.kind == "structural_tag":
        return replace(shape, constraint=None, enforced=False)
    return replace(shape, enforced=False)


def tool_constraint(tools: list[ToolSpec], choice: object, parallel: bool) -> Constraint:
    """A structural tag over the model's call format (guardrails.tool_prompt): with `auto`
    free text until `<tool_call>`, then a valid call of a declared tool; with `required`
    or a named function, nothing but calls (of that function)."""
    if isinstance(choice, NamedToolChoice):
        # A named function is one call of it, as OpenAI answers it.
        tools = [t for t in tools if t.name == choice.function.name]
        parallel = False
    tags = [_call_tag(tool) for tool in tools]
    if choice in (None, "auto"):
        structure: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": ["<tool_call>"],
            "tags": tags,
            "at_least_one": False,
            "stop_after_first": not parallel,
        }
    else:
        structure = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    source = json.dumps({"type": "structural_tag", "format": structure}, sort_keys=True)
    return Constraint("structural_tag", source)


def _call_tag(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": f'<tool_call>\n{{"name": {json.dumps(tool.name)}, "arguments": ',
        "content": {
            "type": "json_schema",
            "json_schema": tool.parameters,
            "max_whitespace_cnt": _ARGUMENT_WHITESPACE,
        },
        "end": "}\n</tool_call>",
    }


def _tool_mode(body: ChatCompletionRequest, tools: list[ToolSpec]) -> ToolMode:
    if not tools or body.tool_choice == "none":
        return "none"
    if body.tool_choice == "auto" or body.tool_choice is None:
        return "auto"
    return "required"  # "required" or a named function: the answer is a call
