"""What every route that runs the model checks before it does, and how the engine's
refusals read to the client."""

from __future__ import annotations

from collections.abc import Sequence

from engine import (
    ChatMessage,
    ContextLengthExceeded,
    Engine,
    EngineError,
    EngineOverloaded,
    UnsupportedParameter,
    UpstreamEngine,
    UpstreamRejected,
    UpstreamUnavailable,
)
from gateway.http.errors import ApiError
from gateway.models import ModelRegistry, UnknownModel
from gateway.policy.schema import ModelLimits

# What the engines refuse a request with, before or while they answer it.
EngineRefusal = (
    EngineOverloaded,
    ContextLengthExceeded,
    UpstreamUnavailable,
    UpstreamRejected,
    UnsupportedParameter,
)


def check_model(requested: str | None, served: str) -> None:
    """A request may name the served model, or none."""
    if requested not in (None, "", served):
        raise ApiError(
            404,
            f"The model '{requested}' does not exist. Available: {served}.",
            code="model_not_found",
            param="model",
        )


def model_engine(models: ModelRegistry, requested: str | None, limits: ModelLimits) -> Engine:
    """The engine serving `requested` (none: the default model), if this policy allows it."""
    try:
        engine = models.engine_for(requested)
    except UnknownModel as exc:
        raise ApiError(404, str(exc), code="model_not_found", param="model") from exc
    allowed = limits.allowed_models
    if allowed is not None and engine.model_id not in allowed:
        raise ApiError(
            403,
            f"This key's policy does not allow the model '{engine.model_id}'. "
            f"Allowed: {', '.join(allowed) or 'none'}.",
            code="model_not_allowed",
            param="model",
        )
    return engine


async def prompt_tokens(engine: Engine, messages: Sequence[ChatMessage]) -> int:
    """The prompt's tokens: the upstream's own count (`/tokenize`) where it has one, else
    the engine's (exact in-process; a local tokenizer or the estimate upstream). Only for
    text the input checks passed: the upstream sees what it is asked to count."""
    if isinstance(engine, UpstreamEngine):
        return await engine.exact_prompt_tokens(messages)
    return engine.count_prompt_tokens(messages)


def check_token_bias(engine: Engine, biased: bool) -> None:
    """An engine without a vocabulary here (an upstream's: `vocab_size` 0) takes no
    `logit_bias`, whose ids would name tokens of a tokenizer Bastion does not have."""
    if biased and engine.vocab_size == 0:
        raise ApiError(
            400,
            f"logit_bias is not supported for the model '{engine.model_id}': its token ids "
            "are its upstream server's.",
            param="logit_bias",
            code="unsupported_parameter",
        )


def answer_budget(limits: ModelLimits, max_tokens: int, temperature: float) -> int:
    """`max_tokens`, once it and the temperature are within the policy."""
    if max_tokens > limits.max_tokens:
        raise ApiError(
            400,
            f"max_tokens is {max_tokens}, above this policy's limit of {limits.max_tokens}.",
            param="max_tokens",
            code="invalid_value",
        )
    if not limits.min_temperature <= temperature <= limits.max_temperature:
        raise ApiError(
            400,
            f"temperature must be between {limits.min_temperature} and "
            f"{limits.max_temperature} under this policy.",
            param="temperature",
            code="invalid_value",
        )
    return max_tokens


def engine_refusal(exc: EngineError, prompt_param: str) -> ApiError:
    """The engine's refusal (one of `EngineRefusal`) as the client can act on it: retry
    later, or shorten `prompt_param` or `max_tokens`, or drop a parameter."""
    if isinstance(exc, EngineOverloaded):
        return ApiError(
            429,
            str(exc),
            type="rate_limit_error",
            code="engine_overloaded",
            headers={"retry-after": str(max(1, round(exc.retry_after_s)))},
        )
    if isinstance(exc, UpstreamUnavailable):
        return ApiError(
            exc.status,
            str(exc),
            type="server_error",
            code="upstream_unavailable" if exc.status != 504 else "upstream_timeout",
            headers={"retry-after": str(max(1, round(exc.retry_after_s)))},
        )
    if isinstance(exc, UpstreamRejected):
        return ApiError(exc.status, str(exc), code="upstream_rejected")
    if isinstance(exc, UnsupportedParameter):
        return ApiError(400, str(exc), param=exc.param, code="unsupported_parameter")
    if isinstance(exc, ContextLengthExceeded):
        return context_error(exc, prompt_param)
    return ApiError(500, str(exc), type="server_error")


def refusing_upstream(exc: EngineError) -> str | None:
    """The upstream server a refusal came from (for the audit record), if any."""
    return exc.upstream if isinstance(exc, UpstreamUnavailable | UpstreamRejected) else None


def context_error(exc: ContextLengthExceeded, prompt_param: str) -> ApiError:
    return ApiError(400, str(exc), param=prompt_param, code="context_length_exceeded")
