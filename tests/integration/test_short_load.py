"""A short load test (the CI form): concurrent streaming clients for a few seconds.

Every request succeeds or is deliberately refused (429), each leaves exactly one audit
record, and the audit chain still verifies afterwards.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from gateway.audit.chain import verify_chain
from tests.integration.conftest import LiveServer

CLIENTS = 8
SECONDS = 6.0


async def _client(base: str, key: str, deadline: float, results: list[tuple[int, str]]) -> None:
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=120) as client:
        while time.monotonic() < deadline:
            body = {
                "messages": [{"role": "user", "content": "Name a colour."}],
                "max_tokens": 6,
                "stream": True,
            }
            async with client.stream(
                "POST", f"{base}/v1/chat/completions", headers=headers, json=body
            ) as response:
                text = "".join([chunk async for chunk in response.aiter_text()])
                if response.status_code == 200:
                    assert text.rstrip().endswith("data: [DONE]"), text[-200:]
                results.append((response.status_code, response.headers["x-request-id"]))


def test_concurrent_streaming_clients(live_server: LiveServer) -> None:
    results: list[tuple[int, str]] = []
    deadline = time.monotonic() + SECONDS

    async def run() -> None:
        await asyncio.gather(
            *(
                _client(live_server.base_url, live_server.api_key, deadline, results)
                for _ in range(CLIENTS)
            )
        )

    asyncio.run(run())
    assert len(results) >= CLIENTS
    assert all(status in (200, 429) for status, _ in results), results
    for _, request_id in results:
        assert len(live_server.audit_rows(request_id)) == 1
    report = verify_chain(live_server.services.sessions)
    assert report.ok, report.problems
