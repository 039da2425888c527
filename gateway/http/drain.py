"""Graceful drain: once the process is told to stop, it refuses new requests with 503 and
counts the ones it still serves, so that it can exit when they are done.

`DrainingServer` (gateway/http/draining_server.py) starts the drain on SIGTERM and stops
uvicorn when `Drain.idle` or the grace period says so; `/readyz` reads `Drain.draining`;
`/metrics` reads `Drain.model_requests` (`bastion_requests_in_flight`, what an autoscaler
follows where there is no engine queue).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

from litestar import Litestar
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.audit.entries import refusal_entry
from gateway.http.errors import ApiError
from gateway.services import Services

# Still answered while draining: the probes say why, and metrics stay scrapeable.
ALWAYS_ANSWERED = frozenset({"/healthz", "/readyz", "/metrics"})


class Drain:
    """Whether the process is draining, since when, and how many requests it serves;
    `model_paths` are the routes that run a model (chat, completions, embeddings)."""

    def __init__(self, model_paths: Collection[str] = ()) -> None:
        self.started_at: float | None = None
        self._model_paths = frozenset(model_paths)
        self._serving: dict[asyncio.Task[object], str] = {}  # each request's task: its path

    @property
    def in_flight(self) -> int:
        return len(self._serving)

    @property
    def model_requests(self) -> int:
        """How many of the requests served run a model, streams until their last event."""
        return sum(path in self._model_paths for path in self._serving.values())

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def begin(self) -> None:
        """Start draining; safe to call from a signal handler (it only sets a field)."""
        if self.started_at is None:
            self.started_at = time.monotonic()

    def seconds(self) -> float:
        """How long the drain has run; 0 before it starts."""
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at

    @property
    def idle(self) -> bool:
        return not self._serving

    def cut_short(self) -> None:
        """Cancel what is still served once the grace period is over: each request then
        ends as a client that left does (recorded once, as cancelled), while the loop
        still runs to write its record."""
        for task in self._serving:
            task.cancel()


def shutting_down() -> ApiError:
    """A request that arrived after the drain began; another replica can serve it."""
    return ApiError(
        503,
        "This Bastion replica is shutting down and takes no new requests; retry, another "
        "replica will serve it.",
        type="server_error",
        code="shutting_down",
        headers={"retry-after": "1", "connection": "close"},
    )


def refuse_while_draining(app: ASGIApp) -> ASGIApp:
    """Middleware, before any guard: count the requests being served, and once the drain
    has begun refuse new ones with 503 `shutting_down` (each with one audit record)."""

    async def gated(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["path"] in ALWAYS_ANSWERED:
            await app(scope, receive, send)
            return
        drain: Drain = Litestar.from_scope(scope).state.drain
        if drain.draining:
            await _refuse(scope)
        task = asyncio.current_task()
        assert task is not None, "an ASGI request runs in a task"
        drain._serving[task] = scope["path"]
        try:
            await app(scope, receive, send)
        finally:
            drain._serving.pop(task, None)

    return gated


async def _refuse(scope: Scope) -> None:
    error = shutting_down()
    services: Services | None = Litestar.from_scope(scope).state.get("services")
    if services is not None:
        entry = refusal_entry(scope, "request.rejected", "rejected", error)
        await services.audit.record_async(entry)
    raise error
