"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ApiError(Exception):
    """An error the client sees, with OpenAI's status, type and code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers={"www-authenticate": "Bearer"})


def not_found(message: str, param: str | None = None) -> ApiError:
    """No such object for this caller: the same 404 whether it is absent or another
    tenant's."""
    return ApiError(404, message, type="not_found_error", code="not_found", param=param)


def guardrail_block(check: str, reason: str, param: str = "messages") -> ApiError:
    """A request a guardrail refused; retrying the same request cannot succeed."""
    return ApiError(
        400,
        f"The request was blocked by the {check} guardrail: {reason}",
        code="content_policy_violation",
        param=param,
        headers={"x-should-retry": "false"},
    )


def database_unavailable() -> ApiError:
    """The database cannot be reached: nothing is answered that could not be audited."""
    return ApiError(
        503,
        "The audit database is unreachable, so the request was not served; retry shortly.",
        type="server_error",
        code="database_unavailable",
        headers={"retry-after": "5"},
    )


def from_validation_error(exc: ValidationError) -> ApiError:
    """The first problem of a request body, named by its JSON path (`messages.0.role`)."""
    first = exc.errors()[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    message = str(first["msg"])
    if first["type"] == "missing":
        message = f"Missing required parameter: '{param}'."
    elif first["type"] == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return ApiError(400, message, param=param, code="invalid_value")
