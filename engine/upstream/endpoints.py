"""The upstream URLs of one model and what is known of each: its circuit breaker, its last
health check, what the server said of itself and (per event loop) its concurrency slots;
which to try next."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from engine.upstream.circuit_breaker import CircuitBreaker
from engine.upstream.config import UpstreamConfig
from engine.upstream.server_info import ServerInfo


@dataclass(slots=True)
class Endpoint:
    """One base URL. `healthy` is None until its first health check; `info` is None until
    the server answers it, and again once a check or a request finds the server gone (a
    server that comes back may be another one)."""

    url: str
    breaker: CircuitBreaker
    slots: asyncio.Semaphore
    healthy: bool | None = None
    info: ServerInfo | None = None


@dataclass(slots=True)
class EndpointPool:
    """The model's endpoints in the config's order."""

    endpoints: list[Endpoint] = field(default_factory=list)

    @classmethod
    def from_config(cls, config: UpstreamConfig) -> EndpointPool:
        return cls(
            [
                Endpoint(
                    url.rstrip("/"),
                    CircuitBreaker(config.circuit_failures, config.circuit_reset_s),
                    asyncio.Semaphore(config.max_concurrency),
                )
                for url in config.base_urls
            ]
        )

    def next_endpoint(self, tried: set[str]) -> Endpoint | None:
        """The endpoint to try next: circuits closed, not yet tried for this request
        (unless all have been), healthy ones first, then those with a free slot, then the
        config's order. None when every circuit is open."""
        open_ = [e for e in self.endpoints if not e.breaker.is_open]
        if not open_:
            return None
        fresh = [e for e in open_ if e.url not in tried] or open_
        return min(
            fresh,
            key=lambda e: (e.healthy is False, e.slots.locked(), self.endpoints.index(e)),
        )

    def context_window(self) -> int | None:
        """The smallest window the servers said (a request may go to any of them), or None
        when none has said one."""
        windows = [
            e.info.context_window
            for e in self.endpoints
            if e.info is not None and e.info.context_window is not None
        ]
        return min(windows, default=None)

    def retry_after_s(self) -> float:
        """Seconds until the first open circuit lets a trial through."""
        waits = [e.breaker.retry_after_s() for e in self.endpoints]
        return max(min(waits, default=1.0), 1.0)

    def rebind_slots(self, max_concurrency: int) -> None:
        """Fresh semaphores for a new event loop (asyncio primitives belong to one)."""
        for endpoint in self.endpoints:
            endpoint.slots = asyncio.Semaphore(max_concurrency)
