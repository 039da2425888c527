"""What an upstream engine holds on one event loop: the HTTP client, the health-check
task, and the count of streams in flight, so that closing waits for them.

asyncio objects belong to the loop that made them; the gateway runs one loop, tests run
one per test, and each gets its own resources.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from engine.upstream.http_client import HTTPClient


@dataclass(slots=True)
class LoopResources:
    loop: asyncio.AbstractEventLoop
    client: HTTPClient
    health: asyncio.Task[None] | None = None
    in_flight: int = 0
    closing: bool = False
    _shutdown: asyncio.Future[None] | None = field(default=None)

    def begin_stream(self) -> None:
        self.in_flight += 1

    async def end_stream(self) -> None:
        self.in_flight -= 1
        if self.closing and self.in_flight == 0:
            await self.client.aclose()

    async def shut(self) -> None:
        """Stop the health checks now; close the client now, or after the last stream in
        flight ends (a hot reload closes an engine whose answers are still streaming)."""
        if self.health is not None:
            self.health.cancel()
        self.closing = True
        if self.in_flight == 0:
            await self.client.aclose()

    def shut_soon(self) -> None:
        """`shut` from synchronous code on any thread, if the loop still runs."""
        if self.loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._shutdown = self.loop.create_task(self.shut())
        elif self.loop.is_running():
            self._shutdown = asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(self.shut(), self.loop), loop=self.loop
            )
