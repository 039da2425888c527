"""The chat request's parameters against each other and against the policy: what the
request model alone cannot judge. Each refusal is a 400 naming the parameter."""

from __future__ import annotations

from gateway.chat.schemas import ChatCompletionRequest, NamedToolChoice, ResponseFormatJsonSchema
from gateway.http.errors import ApiError
from gateway.policy.schema import ModelLimits
from gateway.structured import SchemaLimits, SchemaRefused, check_client_schema
from guardrails import ToolSpec


def check_parameters(body: ChatCompletionRequest, limits: ModelLimits, vocab_size: int) -> None:
    """Parameters that are valid alone but not together, or not under this policy."""
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs requires logprobs to be true.", param="top_logprobs")
    _check_choices(body, limits)
    _check_tool_choice(body)
    _check_tool_results(body)
    for token, _ in body.token_bias:
        if token >= vocab_size:
            raise ApiError(
                400,
                f"logit_bias names token {token}; this model's token ids are below {vocab_size}.",
                param="logit_bias",
            )


def allowed_tools(body: ChatCompletionRequest, limits: ModelLimits) -> list[ToolSpec]:
    """The tools the request declares (none with `tool_choice: "none"`), once the policy
    allows each of them."""
    if not body.tools or body.tool_choice == "none":
        return []
    tools = [
        ToolSpec(
            name=tool.function.name,
            parameters=tool.function.parameters,
            description=tool.function.description,
        )
        for tool in body.tools
    ]
    if not limits.allow_tools:
        raise ApiError(400, "Tools are not allowed by this policy.", param="tools")
    if limits.allowed_tools is not None:
        refused = sorted({t.name for t in tools} - set(limits.allowed_tools))
        if refused:
            raise ApiError(
                400,
                f"This policy does not allow the tools: {', '.join(refused)}.",
                param="tools",
                code="tool_not_allowed",
            )
    return tools


def check_client_schemas(
    body: ChatCompletionRequest, tools: list[ToolSpec], limits: SchemaLimits
) -> None:
    """Client schemas are untrusted: each must pass the policy's limits and use only
    keywords the constraint enforces."""
    try:
        response = body.response_format
        if isinstance(response, ResponseFormatJsonSchema):
            check_client_schema(
                response.json_schema.json_schema, limits, "response_format.json_schema.schema"
            )
        for index, tool in enumerate(tools):
            check_client_schema(tool.parameters, limits, f"tools.{index}.function.parameters")
    except SchemaRefused as exc:
        raise ApiError(400, str(exc), param=exc.param, code="invalid_schema") from exc


def _check_choices(body: ChatCompletionRequest, limits: ModelLimits) -> None:
    if body.stream and body.n > 1:
        raise ApiError(
            400,
            "n > 1 is not supported with stream; ask for one choice per request.",
            param="n",
            code="unsupported_parameter",
        )
    if body.n > limits.max_choices:
        raise ApiError(
            400,
            f"n is {body.n}, above this policy's limit of {limits.max_choices}.",
            param="n",
            code="invalid_value",
        )


def _check_tool_choice(body: ChatCompletionRequest) -> None:
    declared = {tool.function.name for tool in body.tools or []}
    if body.tool_choice not in (None, "none") and not declared:
        raise ApiError(400, "tool_choice needs tools.", param="tool_choice")
    named = body.tool_choice
    if isinstance(named, NamedToolChoice) and named.function.name not in declared:
        raise ApiError(
            400,
            f"tool_choice names the function '{named.function.name}', which is not in tools.",
            param="tool_choice",
        )


def _check_tool_results(body: ChatCompletionRequest) -> None:
    """A tool result must answer a call an earlier assistant message made."""
    called: set[str] = set()
    for index, message in enumerate(body.messages):
        called.update(call.id for call in message.tool_calls or [])
        if message.role == "tool" and message.tool_call_id not in called:
            raise ApiError(
                400,
                "A message with role 'tool' must answer an earlier assistant tool call: "
                f"its tool_call_id {message.tool_call_id!r} names none.",
                param=f"messages.{index}.tool_call_id",
            )
