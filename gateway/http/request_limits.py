"""Limits on a request that the HTTP server does not enforce itself.

uvicorn with httptools (its default) reads headers of any size, so the app refuses
oversized ones itself: with 431 in OpenAI's shape, and one audit record.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.audit.entries import refusal_entry
from gateway.http.errors import ApiError
from gateway.services import Services

MAX_HEADER_BYTES = 32 * 1024  # as nginx's default large_client_header_buffers (4 x 8k)


def refuse_large_headers(app: ASGIApp) -> ASGIApp:
    """Middleware, before any guard: refuse a request whose headers add up to more than
    the limit."""

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        size = sum(len(name) + len(value) for name, value in scope["headers"])
        if size > MAX_HEADER_BYTES:
            await _refuse(scope, size)
        await app(scope, receive, send)

    return limited


async def _refuse(scope: Scope, size: int) -> None:
    error = ApiError(
        431,
        f"The request's headers are {size} bytes, above the limit of {MAX_HEADER_BYTES}.",
        code="headers_too_large",
    )
    services: Services | None = Litestar.from_scope(scope).state.get("services")
    if services is not None:
        entry = refusal_entry(scope, "request.rejected", "rejected", error)
        await services.audit.record_async(entry)
    raise error
