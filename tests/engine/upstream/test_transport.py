"""The upstream client's transport: a request on a kept connection that the server closed
is sent again on a new one; the same failure on a new connection is raised."""

from __future__ import annotations

import asyncio

import httpx2
import pytest

from engine.upstream.transport import PooledTransport
from tests.engine.upstream.fault_server import fault_server

LIMITS = httpx2.Limits(max_connections=None, max_keepalive_connections=32)
BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True}


def test_a_kept_connection_closed_under_the_next_request_fails_with_httpx2_alone() -> None:
    """The fault the transport exists for (what the next test would meet without it)."""

    async def scenario() -> None:
        async with (
            fault_server("keep_alive") as closing,
            httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(limits=LIMITS)) as client,
        ):
            assert (await client.get(f"{closing.base_url}/models")).status_code == 200
            with pytest.raises((httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)):
                await client.post(f"{closing.base_url}/chat/completions", json=BODY)

    asyncio.run(scenario())


def test_a_request_on_a_kept_connection_the_server_closed_is_sent_again() -> None:
    async def scenario() -> None:
        async with (
            fault_server("keep_alive") as closing,
            httpx2.AsyncClient(transport=PooledTransport(LIMITS)) as client,
        ):
            assert (await client.get(f"{closing.base_url}/models")).status_code == 200
            async with client.stream(
                "POST", f"{closing.base_url}/chat/completions", json=BODY
            ) as answer:
                lines = [line async for line in answer.aiter_lines() if line]
            assert lines[-1] == "data: [DONE]"
            assert closing.dropped == 1  # the kept connection was reused, and closed
            assert closing.bodies == [BODY]  # the whole body, on the new connection

    asyncio.run(scenario())


def test_a_new_connection_closed_without_an_answer_is_not_sent_again() -> None:
    async def scenario() -> None:
        connections = 0

        async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")
            writer.close()

        listener = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        try:
            async with httpx2.AsyncClient(transport=PooledTransport(LIMITS)) as client:
                with pytest.raises(httpx2.RemoteProtocolError):
                    await client.get(f"http://127.0.0.1:{port}/v1/models")
        finally:
            listener.close()
        assert connections == 1

    asyncio.run(scenario())
