"""Per-request identity: a request id on every response, and the caller's API key."""

from __future__ import annotations

import re
import uuid
from typing import Any

import structlog
from litestar.datastructures import MutableScopeHeaders
from litestar.types import ASGIApp, Message, Receive, Scope, Send

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_STATE_KEY = "bastion_request_id"


def request_id_of(scope: Scope) -> str:
    """The request's id: the client's `x-request-id` when it is safe, else a new one."""
    state: dict[str, Any] = scope.setdefault("state", {})
    existing = state.get(_STATE_KEY)
    if existing:
        return str(existing)
    incoming = ""
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            incoming = value.decode("latin-1")
            break
    request_id = incoming if _SAFE_ID.match(incoming) else f"req_{uuid.uuid4().hex}"
    state[_STATE_KEY] = request_id
    return request_id


async def add_request_id_header(message: Message, scope: Scope) -> None:
    """`before_send` hook: every HTTP response, errors included, carries `x-request-id`."""
    if message["type"] == "http.response.start":
        headers = MutableScopeHeaders.from_message(message)
        headers["x-request-id"] = request_id_of(scope)


def bearer_token(headers: Any) -> str | None:
    value = headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return str(token.strip())


def bind_log_context(app: ASGIApp) -> ASGIApp:
    """Middleware, the outermost: every log line of a request carries its request id."""

    async def bound(scope: Scope, receive: Receive, send: Send) -> None:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(
            request_id=request_id_of(scope), path=scope.get("path", "")
        )
        await app(scope, receive, send)

    return bound
