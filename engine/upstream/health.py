"""The background health check: every `health_interval_s`, `GET {base}/models` on each
URL; the engine tries healthy URLs first. It runs on the gateway's loop from the first
request until the engine closes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from engine.upstream.endpoints import Endpoint
from engine.upstream.http_client import HTTPClient, HTTPError

log = structlog.get_logger(__name__)


async def check_health(
    client: HTTPClient, endpoint: Endpoint, headers: dict[str, str], timeout_s: float
) -> bool:
    """One check: a 2xx within `timeout_s`. Records the result on the endpoint."""
    try:
        response = await client.request("GET", f"{endpoint.url}/models", headers, timeout=timeout_s)
        healthy = response.is_success
    except HTTPError:
        healthy = False
    if healthy != endpoint.healthy:
        log.info("upstream_health", upstream=endpoint.url, healthy=healthy)
    endpoint.healthy = healthy
    return healthy


async def watch_health(
    check: Callable[[Endpoint], Awaitable[bool]],
    endpoints: list[Endpoint],
    interval_s: float,
) -> None:
    """Check every endpoint at once, every `interval_s`, until cancelled."""
    while True:
        await asyncio.gather(*(check(e) for e in endpoints))
        await asyncio.sleep(interval_s)
