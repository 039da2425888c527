"""The upstream HTTP/1.1 client: asyncio's transports, llhttp's parser (httptools), and a
pool of kept-alive connections per origin.

Why not a general client: the gateway's event loop carries every stream, so what a client
spends on the loop per request and per chunk is paid by all of them. At 32 streams at
once httpx2 (over httpcore2, h11 and anyio) spent about 5.6 ms of the loop a stream of 33
chunks against bench/paced_upstream.py, a third of it opening the stream; this client
spends about 1 ms: it writes a request in one `write`, parses the answer in C as it
arrives, and wakes its reader once a packet rather than a few times a line.

A server closes an idle kept-alive connection after its own timeout (uvicorn's, under vLLM
and SGLang, and llama-server's are 5 s), or after an answer without saying so. A request
sent on such a connection fails before any byte of an answer: a reset, or the connection
closed without an answer. It never met a live server, so it is sent once more on a new
connection, before the engine's retries, failover or circuit breaker count anything. The
same failure on a connection opened for the request is the server's own, and is raised.

Deadlines are the loop's clock (`loop.time()`). A connection keeps one timer for the
reader's deadline and moves it only when the deadline comes nearer; when it fires before a
later deadline it is set again, so that a stream's reads do not each arm and cancel one.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

# Under the servers' own 5 s: a connection idle longer is closed rather than reused, as
# the server may be closing it at that moment.
KEEPALIVE_EXPIRY_S = 4.0
MAX_IDLE_PER_ORIGIN = 32
# Body bytes held unread before the connection stops reading (the reader is slow).
READ_HIGH_WATER = 256 * 1024
# A timer may fire this much before its time (the loop's clock resolution).
TIMER_SLACK_S = 0.001

Origin = tuple[str, str, int]
_BREAKS = frozenset("\r\n\0")


class HTTPError(Exception):
    """A request to an upstream failed: its connection, or its status."""


class TransportError(HTTPError):
    """The connection failed before the whole answer came."""


class ConnectError(TransportError):
    """The connection was refused, or the host could not be reached or resolved."""


class ConnectTimeout(TransportError):
    """The connection was not accepted within the connect timeout."""


class ReadTimeout(TransportError):
    """The whole answer did not come within the request's timeout."""


class ReadError(TransportError):
    """The connection broke (a reset) while the answer was awaited or read."""


class RemoteProtocolError(TransportError):
    """The server closed the connection without (the whole of) an answer, or sent
    something that is not HTTP."""


class StatusError(HTTPError):
    """`raise_for_status` of an answer that is not a 2xx."""

    def __init__(self, status: int, url: str) -> None:
        self.status = status
        super().__init__(f"{url} answered {status}")


class _Connection(asyncio.Protocol):
    """One connection: requests written whole, answers parsed as their bytes arrive."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline = 0.0
        self._paused = False
        self.in_use = True
        self.closed = False
        self.idle_since = 0.0
        self._begin()

    def _begin(self) -> None:
        """The state of one answer."""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.received = False
        self.error: TransportError | None = None
        self._body = bytearray()
        self._length_known = False  # else the body ends when the connection does

    # -- asyncio's protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A socket's transport (uvloop's is none of asyncio's classes).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.in_use:  # nothing is asked of an idle connection: it is not HTTP
            self.close()
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = RemoteProtocolError(f"an answer that is not HTTP ({exc})")
            self.close()
        self._wake()

    def eof_received(self) -> None:
        """The server closed its side: the connection closes (`connection_lost` follows)."""

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        if self.in_use and not self.complete and self.error is None:
            if exc is not None:
                self.error = ReadError(f"{type(exc).__name__}: {exc}")
                self.error.__cause__ = exc
            elif self.headers_done and not self._length_known:
                self.complete = True  # a body without a length ends with its connection
            else:
                said = "before the whole answer" if self.headers_done else "without an answer"
                self.error = RemoteProtocolError(f"the server closed the connection {said}")
        self._wake()

    # -- httptools' callbacks -----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self._length_known = "content-length" in self.headers or "chunked" in self.headers.get(
            "transfer-encoding", ""
        )
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body += body
        if len(self._body) > READ_HIGH_WATER and not self._paused and self._transport:
            self._paused = True
            self._transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True

    # -- what a request does with it ----------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self.closed and self._transport is not None and not self._transport.is_closing()

    def send(self, data: bytes) -> None:
        assert self._transport is not None
        self._begin()
        self.in_use = True
        self._transport.write(data)

    async def head(self, deadline: float) -> None:
        """Until the answer's status and headers have come."""
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            await self._wait(deadline)

    async def receive(self, deadline: float) -> bytes:
        """The body's bytes that have come (waiting for some); b"" at its end."""
        while not self._body:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait(deadline)
        data = bytes(self._body)
        self._body.clear()
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    def idle(self) -> None:
        """Back in the pool, between requests."""
        self.in_use = False
        self.idle_since = self._loop.time()
        self._cancel_timer()

    def close(self) -> None:
        self.closed = True
        self._cancel_timer()
        if self._transport is not None:
            self._transport.close()

    # -- waiting ------------------------------------------------------------------------

    async def _wait(self, deadline: float) -> None:
        """Until the parser or the connection has news; TimeoutError at `deadline`."""
        waiter = self._loop.create_future()
        self._waiter = waiter
        self._deadline = deadline
        if self._timer is None or self._timer_at > deadline:
            self._cancel_timer()
            self._timer = self._loop.call_at(deadline, self._on_timer)
            self._timer_at = deadline
        try:
            await waiter
        finally:
            self._waiter = None

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody is waiting: the next wait sets its own
        if self._loop.time() + TIMER_SLACK_S >= self._deadline:
            waiter.set_exception(TimeoutError())
        else:  # the deadline moved on since the timer was set
            self._timer = self._loop.call_at(self._deadline, self._on_timer)
            self._timer_at = self._deadline

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Response:
    """An answer whose body is read as it comes. `close` it (always): its connection goes
    back to the pool when the body was read to its end, else it is closed (a server that
    is streaming sees the client leave and stops)."""

    __slots__ = ("_client", "_conn", "_origin", "_released", "headers", "status")

    def __init__(self, client: HTTPClient, conn: _Connection, origin: Origin) -> None:
        self._client = client
        self._conn = conn
        self._origin = origin
        self.status = conn.status
        self.headers = conn.headers
        self._released = False

    async def receive(self, deadline: float) -> bytes:
        """The next bytes of the body (b"" at its end); TimeoutError at `deadline`."""
        return await self._conn.receive(deadline)

    async def read(self, deadline: float) -> bytes:
        """The rest of the body."""
        parts = []
        while part := await self._conn.receive(deadline):
            parts.append(part)
        return b"".join(parts)

    def close(self) -> None:
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.complete and conn.keep_alive and conn.error is None and conn.usable:
            self._client._keep(self._origin, conn)
        else:
            conn.close()


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer (`HTTPClient.request`)."""

    url: str
    status: int
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON; raises ValueError."""
        return json.loads(self.content)

    def raise_for_status(self) -> None:
        if not self.is_success:
            raise StatusError(self.status, self.url)


class HTTPClient:
    """Requests to upstream servers on one event loop, kept-alive connections reused (the
    newest first), `MAX_IDLE_PER_ORIGIN` of them idle at most per origin."""

    def __init__(self, connect_timeout: float, timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._idle: dict[Origin, list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def open(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        deadline: float,
    ) -> Response:
        """Sends the request; returns once the answer's status and headers have come
        (TimeoutError at `deadline`), the body to be read from the `Response`."""
        if self._closed:
            raise RuntimeError("the upstream HTTP client is closed")
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        origin = (scheme, parts.hostname, parts.port or (443 if scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        data = _request_bytes(method, target, parts.netloc, headers, body)
        conn = self._take(origin)
        if conn is not None:
            try:
                return await self._exchange(conn, origin, data, deadline)
            except (ReadError, RemoteProtocolError):
                if conn.received:
                    raise
                # The server had closed the kept connection: the request met no server.
        conn = await self._connect(origin, deadline)
        return await self._exchange(conn, origin, data, deadline)

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        *,
        json_body: Any = None,
        timeout: float | None = None,
    ) -> Answer:
        """The whole answer, within `timeout` seconds (the client's by default); raises
        `TransportError` (`ReadTimeout` when it runs out)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._timeout if timeout is None else timeout)
        body = None if json_body is None else encode_json(json_body)
        try:
            response = await self.open(method, url, headers, body, deadline)
            try:
                content = await response.read(deadline)
            finally:
                response.close()
        except TimeoutError as exc:
            raise ReadTimeout(f"no whole answer from {url} in time") from exc
        return Answer(url, response.status, content)

    async def aclose(self) -> None:
        """Closes the idle connections; those in use close when their answer does."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    # -- internals ----------------------------------------------------------------------

    async def _exchange(
        self, conn: _Connection, origin: Origin, data: bytes, deadline: float
    ) -> Response:
        try:
            conn.send(data)
            await conn.head(deadline)
        except BaseException:
            conn.close()
            raise
        return Response(self, conn, origin)

    def _take(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if conn.usable and now - conn.idle_since < KEEPALIVE_EXPIRY_S:
                return conn
            conn.close()
        return None

    def _keep(self, origin: Origin, conn: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if self._closed or len(idle) >= MAX_IDLE_PER_ORIGIN:
            conn.close()
            return
        conn.idle()
        idle.append(conn)

    async def _connect(self, origin: Origin, deadline: float) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        context = self._ssl_context() if scheme == "https" else None
        limit = min(self._connect_timeout, max(0.0, deadline - loop.time()))
        try:
            async with asyncio.timeout(limit):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop),
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context is not None else None,
                )
        except TimeoutError as exc:
            raise ConnectTimeout(f"{host}:{port} did not accept the connection in time") from exc
        except OSError as exc:  # refused, unreachable, not resolved, a TLS failure
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return conn

    def _ssl_context(self) -> ssl.SSLContext:
        """The system's trust store (`SSL_CERT_FILE` / `SSL_CERT_DIR` where set)."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl


def encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _request_bytes(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept: */*"]
    for name, value in headers.items():
        # A line break would end the header early and start another (or the body): a key
        # read from a Secret file with its trailing newline must fail here, not be sent.
        if _BREAKS.intersection(name) or _BREAKS.intersection(value):
            raise ValueError(f"the header {name.strip()!r} holds a line break or NUL")
        lines.append(f"{name}: {value}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body is not None else head
