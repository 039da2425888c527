"""A tiny HTTP server on the test's event loop that misbehaves as upstreams do: hangs,
stalls after its headers, sends malformed SSE, answers 503, streams slowly, resets the
connection mid-answer, or keeps a connection alive and closes it when it is reused. It
can say a context window (`max_model_len`, as vLLM's `/v1/models`) and count tokens
(vLLM's `/tokenize`). It records what it was sent and how many requests it held at once."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal[
    "hang",
    "stall",
    "garbage",
    "status_503",
    "stream",
    "error_mid_stream",
    "reset_mid_stream",  # two chunks, then a TCP reset (a crash, a killed proxy)
    "keep_alive",  # answers with the connection kept, then closes it when a request comes
    "kept",  # streams in the chunked encoding, every request of a connection (as servers do)
]

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def sse(event: dict[str, Any] | str) -> bytes:
    data = event if isinstance(event, str) else json.dumps(event)
    return f"data: {data}\n\n".encode()


def chat_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


@dataclass
class FaultServer:
    mode: Mode
    chunks: int = 3
    chunk_delay_s: float = 0.0
    healthy: bool = True
    port: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    dropped: int = 0  # keep_alive: requests that met a connection closing under them
    connections: int = 0
    context_window: int | None = None
    tokens: int | None = None  # what `/tokenize` answers; None: it is not found (404)
    tokenized: int = 0
    client_closed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def posts(self) -> int:
        return len(self.bodies)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self._serve_one(reader, writer)
            while self.mode == "kept":
                await self._serve_one(reader, writer)
            if self.mode == "keep_alive":
                # As a server whose idle timeout fires just as the next request arrives.
                await reader.readuntil(b"\r\n\r\n")
                self.dropped += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            self.client_closed.set()
        finally:
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode().strip().split("\r\n")
        method = request_line.split()[0]
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in header_lines)
        }
        length = int(headers.get("content-length", 0))
        body = await reader.readexactly(length) if length else b""
        if method == "GET":
            if self.mode == "hang":
                await self._until_closed(reader)
                return
            models = [] if self.context_window is None else [self._model()]
            status = "200 OK" if self.healthy else "500 Internal Server Error"
            await self._json(writer, status, {"object": "list", "data": models})
        elif request_line.split()[1].endswith("/tokenize"):
            self.tokenized += 1
            found = self.tokens is not None
            answer = {"count": self.tokens} if found else {"detail": "Not Found"}
            await self._json(writer, "200 OK" if found else "404 Not Found", answer)
        else:
            self.bodies.append(json.loads(body))
            self.authorizations.append(headers.get("authorization", ""))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                await self._answer(reader, writer)
            finally:
                self.active -= 1

    def _model(self) -> dict[str, Any]:
        return {"id": "smollm2", "object": "model", "max_model_len": self.context_window}

    async def _json(self, writer: asyncio.StreamWriter, status: str, payload: Any) -> None:
        body = json.dumps(payload).encode()
        kept = self.mode in ("keep_alive", "kept")
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(body)}\r\n".encode()
            + (b"\r\n" if kept else b"Connection: close\r\n\r\n")
            + body
        )
        await writer.drain()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "hang":
            await self._until_closed(reader)
        elif self.mode == "stall":
            writer.write(SSE_HEAD)
            await writer.drain()
            await self._until_closed(reader)
        elif self.mode == "garbage":
            writer.write(SSE_HEAD + b"data: {this is not json\n\n")
        elif self.mode == "keep_alive":
            body = b"".join(sse(e) for e in (chat_chunk("kept"), chat_chunk("", "stop"), "[DONE]"))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        elif self.mode == "kept":
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for event in (chat_chunk("kept"), chat_chunk("", "stop"), "[DONE]"):
                data = sse(event)
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            writer.write(b"0\r\n\r\n")
        elif self.mode == "reset_mid_stream":
            writer.write(SSE_HEAD + sse(chat_chunk("w0 ")) + sse(chat_chunk("w1 ")))
            await writer.drain()
            await asyncio.sleep(0.3)
            # Linger 0: closing sends a reset instead of the end of the stream.
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        elif self.mode == "status_503":
            error = b'{"error":{"message":"overloaded"}}'
            writer.write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(error)}\r\nConnection: close\r\n\r\n".encode()
                + error
            )
        else:
            writer.write(SSE_HEAD)
            for i in range(self.chunks):
                writer.write(sse(chat_chunk(f"w{i} ")))
                await writer.drain()
                await asyncio.sleep(self.chunk_delay_s)
            if self.mode == "error_mid_stream":
                writer.write(sse({"error": {"message": "the model crashed"}}))
            else:
                writer.write(sse(chat_chunk("", "stop")))
                usage = {"prompt_tokens": 7, "completion_tokens": self.chunks}
                writer.write(sse({"choices": [], "usage": usage}) + sse("[DONE]"))
        await writer.drain()

    async def _until_closed(self, reader: asyncio.StreamReader) -> None:
        while await reader.read(1024):
            pass
        self.client_closed.set()


@asynccontextmanager
async def fault_server(mode: Mode, **options: Any) -> AsyncIterator[FaultServer]:
    """A `FaultServer` on a free port of 127.0.0.1 for the block's length."""
    server = FaultServer(mode, **options)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
