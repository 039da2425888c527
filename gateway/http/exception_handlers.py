"""Every exception becomes an answer in OpenAI's error shape; a route that audits every
request (`gateway.audit.request_audit`) learns the error before the answer is sent."""

from __future__ import annotations

from typing import Any

import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.types import ExceptionHandlersMap
from sqlalchemy.exc import OperationalError

from gateway.audit.chain import AuditWriteError
from gateway.audit.request_audit import note_error
from gateway.http.body import body_error, nesting_error, raised_reading_the_request
from gateway.http.errors import ApiError, database_unavailable

log = structlog.get_logger(__name__)

_STATUS_TYPES = {
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
}


def api_error_handler(request: Request[Any, Any, Any], exc: ApiError) -> Response[Any]:
    note_error(request.scope, exc)
    return Response(exc.body(), status_code=exc.status, headers=exc.headers)


def http_exception_handler(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Litestar's own errors (404, 405, 413, a body it cannot read) in OpenAI's shape."""
    status = exc.status_code
    error = body_error(request, exc) or ApiError(
        status,
        str(exc.detail),
        type=_STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
        code=None,
        headers=dict(exc.headers or {}),
    )
    return api_error_handler(request, error)


def nesting_error_handler(request: Request[Any, Any, Any], exc: RecursionError) -> Response[Any]:
    """A 400 when Litestar hit the limit reading or validating the body; anywhere else a
    recursion is the server's own bug."""
    if raised_reading_the_request(exc):
        return api_error_handler(request, nesting_error())
    return internal_error_handler(request, exc)


def database_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Fail closed with 503 while the database is down (or SQLite is locked too long):
    the request could not be audited, so it is not served."""
    log.error("gateway.database_unavailable", path=request.url.path, error=str(exc))
    return api_error_handler(request, database_unavailable())


def internal_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("gateway.unhandled_error", path=request.url.path)
    error = ApiError(
        500, "The server had an error while processing your request.", type="server_error"
    )
    return api_error_handler(request, error)


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ApiError: api_error_handler,
    HTTPException: http_exception_handler,
    RecursionError: nesting_error_handler,
    OperationalError: database_error_handler,
    AuditWriteError: database_error_handler,
    Exception: internal_error_handler,
}
