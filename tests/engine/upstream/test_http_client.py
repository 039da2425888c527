"""The upstream HTTP client against real sockets: kept-alive connections reused, bodies in
the chunked encoding (split anywhere), with a length, or up to the connection's close, the
deadlines, a request on a kept connection the server closed sent again, TLS."""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from engine.upstream import http_client
from engine.upstream.http_client import (
    ConnectError,
    HTTPClient,
    ReadError,
    ReadTimeout,
    RemoteProtocolError,
    StatusError,
)
from tests.engine.upstream.fault_server import fault_server

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True}


@asynccontextmanager
async def serving(
    handler: Handler, context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, list[int]]]:
    """`handler` on a free port; yields the origin's URL and a list that counts connections."""
    connections: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(counted, "127.0.0.1", 0, ssl=context)
    port = listener.sockets[0].getsockname()[1]
    scheme = "https" if context is not None else "http"
    try:
        yield f"{scheme}://{'localhost' if context else '127.0.0.1'}:{port}", connections
    finally:
        listener.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in head[1:] if line)
    }
    length = int(headers.get("content-length", "0"))
    return head[0], headers, await reader.readexactly(length) if length else b""


def deadline(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


def test_kept_connections_carry_chunked_answers_split_anywhere() -> None:
    """Each request reads its whole answer on the one connection, although the chunked
    encoding reaches the client a few bytes at a time, cut inside sizes and data."""
    events = [b'data: {"n": %d}\n\n' % n for n in range(5)]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for start in range(0, len(wire), 7):
                writer.write(wire[start : start + 7])
                await writer.drain()
                await asyncio.sleep(0.001)

    async def scenario() -> None:
        async with serving(handler) as (origin, connections):
            client = HTTPClient(connect_timeout=1, timeout=5)
            for _ in range(3):
                response = await client.open(
                    "POST", f"{origin}/v1/chat/completions", {}, b"{}", deadline(5)
                )
                assert response.status == 200
                assert await response.read(deadline(5)) == b"".join(events)
                response.close()
            await client.aclose()
            assert len(connections) == 1

    asyncio.run(scenario())


def test_bodies_with_a_length_or_up_to_the_close() -> None:
    """A body with a length leaves the connection for the next request; one without a
    length ends with the connection, which is not reused."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line, _, _ = await read_request(reader)
        if "length" in request_line:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            await writer.drain()
            await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nto the end")
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        async with serving(handler) as (origin, connections):
            client = HTTPClient(connect_timeout=1, timeout=5)
            assert (await client.request("GET", f"{origin}/length", {})).content == b"hello"
            assert (await client.request("GET", f"{origin}/close", {})).content == b"to the end"
            assert (await client.request("GET", f"{origin}/close", {})).content == b"to the end"
            await client.aclose()
            assert len(connections) == 2  # the first two on one, the third on a new one

    asyncio.run(scenario())


def test_a_body_cut_short_is_a_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        async with serving(handler) as (origin, _):
            client = HTTPClient(connect_timeout=1, timeout=5)
            with pytest.raises(RemoteProtocolError, match="before the whole answer"):
                await client.request("GET", f"{origin}/v1/models", {})
            await client.aclose()

    asyncio.run(scenario())


def test_a_request_on_a_kept_connection_the_server_closed_is_sent_again() -> None:
    async def scenario() -> None:
        async with fault_server("keep_alive") as closing:
            client = HTTPClient(connect_timeout=1, timeout=5)
            assert (await client.request("GET", f"{closing.base_url}/models", {})).is_success
            body = json.dumps(BODY).encode()
            response = await client.open(
                "POST", f"{closing.base_url}/chat/completions", {}, body, deadline(5)
            )
            lines = (await response.read(deadline(5))).decode().split("\n")
            response.close()
            await client.aclose()
            assert "data: [DONE]" in lines
            assert closing.dropped == 1  # the kept connection was reused, and closed
            assert closing.bodies == [BODY]  # the whole body, on the new connection
            assert closing.connections == 2

    asyncio.run(scenario())


def test_a_new_connection_closed_without_an_answer_is_not_sent_again() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    async def scenario() -> None:
        async with serving(handler) as (origin, connections):
            client = HTTPClient(connect_timeout=1, timeout=5)
            with pytest.raises(RemoteProtocolError, match="without an answer"):
                await client.request("GET", f"{origin}/v1/models", {})
            await client.aclose()
            assert len(connections) == 1

    asyncio.run(scenario())


def test_a_connection_idle_past_the_expiry_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_client, "KEEPALIVE_EXPIRY_S", 0.1)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async def scenario() -> None:
        async with serving(handler) as (origin, connections):
            client = HTTPClient(connect_timeout=1, timeout=5)
            await client.request("GET", f"{origin}/a", {})
            await client.request("GET", f"{origin}/b", {})
            assert len(connections) == 1
            await asyncio.sleep(0.2)
            await client.request("GET", f"{origin}/c", {})
            await client.aclose()
            assert len(connections) == 2

    asyncio.run(scenario())


def test_the_read_deadline_moves_with_each_read_and_fires_when_the_server_stops() -> None:
    """Pieces 0.1 s apart, each read given 0.3 s: no timeout for a second, then one 0.3 s
    after the server goes quiet (the connection's one timer, set again as it moves)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(10):
            writer.write(b"2\r\nok\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        await asyncio.sleep(5)

    async def scenario() -> None:
        async with serving(handler) as (origin, _):
            client = HTTPClient(connect_timeout=1, timeout=5)
            response = await client.open("GET", f"{origin}/slow", {}, None, deadline(1))
            received = b""
            with pytest.raises(TimeoutError):
                while True:
                    received += await response.receive(deadline(0.3))
                    last = time.monotonic()
            quiet = time.monotonic() - last
            response.close()
            await client.aclose()
            assert received == b"ok" * 10
            assert 0.25 <= quiet < 0.6

    asyncio.run(scenario())


def test_no_head_by_the_deadline_is_a_timeout_and_the_connection_closes() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # until the client closes
        closed.set()

    async def scenario() -> None:
        async with serving(handler) as (origin, _):
            client = HTTPClient(connect_timeout=1, timeout=0.2)
            started = time.monotonic()
            with pytest.raises(ReadTimeout):
                await client.request("GET", f"{origin}/v1/models", {})
            assert 0.2 <= time.monotonic() - started < 0.5
            await asyncio.wait_for(closed.wait(), 1)
            await client.aclose()

    asyncio.run(scenario())


def test_a_reset_is_a_read_error_that_names_it() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def scenario() -> None:
        async with serving(handler) as (origin, _):
            client = HTTPClient(connect_timeout=1, timeout=5)
            response = await client.open("GET", f"{origin}/x", {}, None, deadline(5))
            assert await response.receive(deadline(5)) == b"ok"
            with pytest.raises(ReadError, match=r"ConnectionResetError: \[Errno 104\]"):
                await response.receive(deadline(5))
            response.close()
            await client.aclose()

    asyncio.run(scenario())


def test_a_refused_connection_and_a_status_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async def scenario() -> None:
        client = HTTPClient(connect_timeout=1, timeout=5)
        with pytest.raises(ConnectError):
            await client.request("GET", "http://127.0.0.1:9/v1/models", {})
        async with serving(handler) as (origin, _):
            answer = await client.request("GET", f"{origin}/tokenize", {})
        with pytest.raises(StatusError) as caught:
            answer.raise_for_status()
        assert caught.value.status == 404
        await client.aclose()

    asyncio.run(scenario())


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async def scenario() -> None:
        client = HTTPClient(connect_timeout=1, timeout=5)
        async with serving(handler) as (origin, connections):
            for value in ("Bearer sk-1\n", "Bearer sk-1\r\nX-Injected: 1", "a\0b"):
                with pytest.raises(ValueError, match="'Authorization'") as caught:
                    await client.request("GET", f"{origin}/v1/models", {"Authorization": value})
                assert "sk-1" not in str(caught.value)
            assert connections == []
        await client.aclose()

    asyncio.run(scenario())


def test_a_large_body_read_slowly_arrives_whole() -> None:
    """Past the high-water mark the connection stops reading until the reader catches up."""
    payload = bytes(range(256)) * 8192  # 2 MiB

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        await writer.drain()

    async def scenario() -> None:
        async with serving(handler) as (origin, _):
            client = HTTPClient(connect_timeout=1, timeout=5)
            response = await client.open("GET", f"{origin}/big", {}, None, deadline(5))
            parts = []
            while part := await response.receive(deadline(5)):
                parts.append(part)
                await asyncio.sleep(0.001)
            response.close()
            await client.aclose()
            assert b"".join(parts) == payload

    asyncio.run(scenario())


def self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https_verifies_the_server_and_keeps_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, headers, body = await read_request(reader)
            answer = json.dumps({"host": headers["host"], "body": body.decode()}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)
            await writer.drain()

    async def scenario() -> None:
        async with serving(handler, server_context) as (origin, connections):
            untrusting = HTTPClient(connect_timeout=1, timeout=5)
            with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.request("GET", f"{origin}/v1/models", {})
            await untrusting.aclose()
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the trust store the system's is
            client = HTTPClient(connect_timeout=1, timeout=5)
            for n in range(2):
                answer = await client.request(
                    "POST", f"{origin}/v1/tokenize", {}, json_body={"n": n}
                )
                assert answer.json() == {"host": origin.split("//")[1], "body": f'{{"n":{n}}}'}
            await client.aclose()
            assert len(connections) == 1  # one for both (a failed handshake reaches no handler)

    asyncio.run(scenario())
