"""What every route that runs the model checks before it does, and how the engine's
refusals read to the client."""

from __future__ import annotations

from engine import ContextLengthExceeded, EngineOverloaded
from gateway.http.errors import ApiError
from gateway.policy.schema import ModelLimits


def check_model(requested: str | None, served: str) -> None:
    """A request may name the served model, or none."""
    if requested not in (None, "", served):
        raise ApiError(
            404,
            f"The model '{requested}' does not exist. Available: {served}.",
            code="model_not_found",
            param="model",
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


def engine_refusal(exc: EngineOverloaded | ContextLengthExceeded, prompt_param: str) -> ApiError:
    """The engine's refusal as the client can act on it: retry later, or shorten
    `prompt_param` or `max_tokens`."""
    if isinstance(exc, EngineOverloaded):
        return ApiError(
            429,
            str(exc),
            type="rate_limit_error",
            code="engine_overloaded",
            headers={"retry-after": str(max(1, round(exc.retry_after_s)))},
        )
    return context_error(exc, prompt_param)


def context_error(exc: ContextLengthExceeded, prompt_param: str) -> ApiError:
    return ApiError(400, str(exc), param=prompt_param, code="context_length_exceeded")
