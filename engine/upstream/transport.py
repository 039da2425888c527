"""The upstream client's transport: httpx2's pool, and one more try for a request whose
pooled connection the server had already closed.

A server closes an idle kept-alive connection after its own timeout (uvicorn's, under vLLM
and SGLang, and llama-server's are 5 s, as long as the pool keeps one), or after an answer
without saying so. A request sent on such a connection fails before any byte of an answer:
a reset, a broken pipe, or "disconnected without sending a response". It never met a live
server, so it is sent once more, before the engine's retries, failover or circuit breaker
count anything; the pool has dropped the closed connection by then. The same failure on a
connection opened for the request is the server's own, and is raised.
"""

from __future__ import annotations

from typing import Any

import httpx2

# What a request on a connection closed at the other end fails with before any answer.
STALE_CONNECTION_ERRORS = (httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)


class _ConnectionWatch:
    """httpcore2's `trace` callback: notes whether the request opened its own connection."""

    __slots__ = ("opened",)

    def __init__(self) -> None:
        self.opened = False

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith((".connect_tcp.started", ".connect_unix_socket.started")):
            self.opened = True


class PooledTransport(httpx2.AsyncBaseTransport):
    """`httpx2.AsyncHTTPTransport` with `limits`, resending once what failed on a reused
    connection before its answer began (bodies the client holds whole, as JSON is)."""

    def __init__(self, limits: httpx2.Limits) -> None:
        self._inner = httpx2.AsyncHTTPTransport(limits=limits)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        watch = _ConnectionWatch()
        request.extensions["trace"] = watch
        try:
            return await self._inner.handle_async_request(request)
        except STALE_CONNECTION_ERRORS:
            if watch.opened or not isinstance(request.stream, httpx2.ByteStream):
                raise
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
