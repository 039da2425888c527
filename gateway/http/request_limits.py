"""Limits on a request that the HTTP server does not enforce itself.

uvicorn with httptools (its default) reads headers of any size, so the app refuses
oversized ones itself: with 431 in OpenAI's shape, and one audit record.
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request

from gateway.audit.log import AuditEntry
from gateway.http.errors import ApiError
from gateway.http.request_context import request_id_of
from gateway.services import Services

MAX_HEADER_BYTES = 32 * 1024  # as nginx's default large_client_header_buffers (4 x 8k)


async def refuse_large_headers(request: Request[Any, Any, Any]) -> None:
    """`before_request` hook: refuse a request whose headers add up to more than the limit."""
    size = sum(len(name) + len(value) for name, value in request.scope["headers"])
    if size <= MAX_HEADER_BYTES:
        return
    error = ApiError(
        431,
        f"The request's headers are {size} bytes, above the limit of {MAX_HEADER_BYTES}.",
        code="headers_too_large",
    )
    services: Services | None = request.app.state.get("services")
    if services is not None:
        entry = AuditEntry(
            request_id=request_id_of(request.scope),
            endpoint=f"{request.method} {request.url.path}",
            event="request.rejected",
            outcome="rejected",
            status_code=error.status,
            error_code=error.code,
        )
        await asyncio.to_thread(services.audit.record, entry)
    raise error
