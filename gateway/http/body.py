"""Request bodies: handlers declare them as typed `data` parameters, so Litestar reads and
validates them (after the guards, so authentication comes first) and the OpenAPI document
shows them; this module keeps what clients see in OpenAI's shape."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import ClientException, HTTPException, SerializationException
from litestar.exceptions import ValidationException as LitestarValidationError
from litestar.handlers import BaseRouteHandler
from pydantic import BaseModel, ValidationError

from gateway.http.errors import ApiError, from_validation_error

_NOT_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you "
    "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
)


async def require_json(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard: a body declared as anything but JSON is refused (415) rather than guessed at.
    A body without a content type is read as JSON."""
    media_type = connection.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type and media_type != "application/json" and not media_type.endswith("+json"):
        raise ApiError(
            415,
            f"Send the body as application/json, not {media_type!r}.",
            code="unsupported_media_type",
        )


def body_error(request: Request[Any, Any, Any], exc: HTTPException) -> ApiError | None:
    """The OpenAI-shaped error for a body (or query) Litestar could not read or validate;
    None for any other HTTP error."""
    if isinstance(exc, LitestarValidationError):
        return _validation_error(request, exc)
    if isinstance(exc, ClientException) and isinstance(exc.__cause__, SerializationException):
        return ApiError(400, _NOT_JSON, code="invalid_json")
    return None


def nesting_error() -> ApiError:
    """A body nested past what the parser and validator can walk (they raise
    RecursionError): the client's problem, not the server's."""
    return ApiError(400, "The JSON body is nested too deeply.", code="invalid_json")


def _validation_error(request: Request[Any, Any, Any], exc: LitestarValidationError) -> ApiError:
    pydantic_error = _pydantic_cause(exc)
    if pydantic_error is not None:
        first = pydantic_error.errors()[0]
        if first["type"] == "model_type" and not first["loc"]:
            return ApiError(400, "The request body must be a JSON object.", code="invalid_json")
        return from_validation_error(pydantic_error)
    problems = exc.extra if isinstance(exc.extra, list) else []
    first_problem: dict[str, Any] = problems[0] if problems else {}
    if first_problem.get("key") == "data" and first_problem.get("source") == "body":
        return _empty_body_error(request)
    key = first_problem.get("key")
    message = str(first_problem.get("message") or exc.detail)
    return ApiError(
        400,
        f"Invalid value for '{key}': {message}" if key else message,
        param=key,
        code="invalid_value",
    )


def _empty_body_error(request: Request[Any, Any, Any]) -> ApiError:
    """An empty body reads as `{}`: the error names the first required parameter."""
    model = request.route_handler.parsed_fn_signature.parameters["data"].annotation
    if isinstance(model, type) and issubclass(model, BaseModel):
        try:
            model.model_validate({})
        except ValidationError as exc:
            return from_validation_error(exc)
    return ApiError(400, "The request needs a JSON body.", code="invalid_json")


def _pydantic_cause(exc: BaseException) -> ValidationError | None:
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, ValidationError):
            return cause
        cause = cause.__cause__
    return None


def raised_reading_the_request(exc: BaseException) -> bool:
    """Whether `exc` came from Litestar turning the request into handler parameters (its
    kwargs extraction or signature validation, which run msgspec and pydantic)."""
    frame = exc.__traceback__
    while frame is not None:
        module = frame.tb_frame.f_globals.get("__name__", "")
        if module.startswith(("litestar._kwargs", "litestar._signature")):
            return True
        frame = frame.tb_next
    return False
