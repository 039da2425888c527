"""One streamed request to one upstream URL, under the timeouts, with its failures sorted.

`open_stream` sends the request and reads up to the first piece of text (or the end of an
empty answer) within `first_token` seconds; what fails before then is an `AttemptFailed`
that says whether another try is safe. `StreamCall.chunks` reads the rest, with `idle`
seconds at most between lines and `total` for the whole answer; there a failure is final
(text has been sent) and raises `UpstreamUnavailable` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engine.types import UpstreamRejected, UpstreamStatus, UpstreamUnavailable
from engine.upstream.chunks import AnswerReader, ChunkText, UpstreamStreamError
from engine.upstream.config import UpstreamTimeouts
from engine.upstream.http_client import (
    ConnectError,
    ConnectTimeout,
    HTTPClient,
    Response,
    TransportError,
    encode_json,
)
from engine.upstream.request_body import UpstreamRequest
from engine.upstream.sse import DONE, MalformedStream, parse_line

# Statuses that say "this server, now" rather than "this request": another try may work.
RETRYABLE_STATUSES = frozenset({502, 503, 504})
# A 4xx the client should see as is; any other 4xx reaches it as a 400.
PASSED_ON_STATUSES = frozenset({400, 404, 413, 422, 429})
# After `[DONE]`, the wait for the rest of the body (the chunked encoding's last chunk),
# without which the connection cannot be kept for another request.
BODY_END_WAIT_S = 0.05


class AttemptFailed(Exception):
    """An attempt that failed before any text: `retryable` when another try is safe."""

    def __init__(self, reason: str, *, status: UpstreamStatus, retryable: bool) -> None:
        self.status = status
        self.retryable = retryable
        super().__init__(reason)


@dataclass(slots=True)
class StreamCall:
    """An open answer stream on `base_url`; `first` holds what was read before the first
    text. Close it (always) to release the connection: unread, the upstream aborts."""

    base_url: str
    response: Response
    reader: AnswerReader
    timeouts: UpstreamTimeouts
    total_deadline: float
    first: list[ChunkText] = field(default_factory=list)
    ended: bool = False
    # The lines of the bytes read so far, and the start of a line still coming.
    _lines: deque[bytes] = field(default_factory=deque)
    _rest: bytes = b""

    async def chunks(self) -> AsyncIterator[ChunkText]:
        """The answer's text as it comes, then nothing once the stream ends."""
        for chunk in self.first:
            yield chunk
        loop = asyncio.get_running_loop()
        while not self.ended:
            deadline = min(loop.time() + self.timeouts.idle, self.total_deadline)
            try:
                following = await self._next_chunk(deadline)
            except TimeoutError as exc:
                if self.reader.finish_reason is not None:
                    return  # the answer is whole; only the usage or [DONE] never came
                raise self._failure("stopped sending (timed out mid-answer)", 504) from exc
            except (TransportError, MalformedStream, UpstreamStreamError) as exc:
                raise self._failure(f"failed mid-answer ({describe(exc)})", 502) from exc
            if following is not None:
                yield following

    async def aclose(self) -> None:
        """Closes the response; after the answer's end, reads the body's own end first
        (briefly), so that the connection goes back to the pool instead of closing."""
        try:
            if self.ended:
                deadline = asyncio.get_running_loop().time() + BODY_END_WAIT_S
                with contextlib.suppress(TimeoutError, TransportError):
                    await self.response.read(deadline)
        finally:
            self.response.close()

    async def _next_chunk(self, deadline: float) -> ChunkText | None:
        """The next line's text (None: a line without any) if it comes by `deadline` (the
        loop's clock); sets `ended` at the end."""
        line = await self._next_line(deadline)
        if line is None:
            self.ended = True
            if self.reader.finish_reason is None:
                raise MalformedStream("the stream ended before the answer did")
            return None
        event = parse_line(line)
        if event == DONE:
            self.ended = True
            if self.reader.finish_reason is None:
                raise MalformedStream("[DONE] before a finish reason")
            return None
        if not isinstance(event, dict):
            return None
        chunk = self.reader.read(event)
        return chunk if chunk.text or chunk.logprobs else None

    async def _next_line(self, deadline: float) -> str | None:
        """The next line of the body (None at its end): one read for all the lines that
        came in one packet."""
        while not self._lines:
            data = await self.response.receive(deadline)
            if not data:
                rest, self._rest = self._rest, b""
                return rest.decode(errors="replace") if rest else None
            *lines, self._rest = (self._rest + data).split(b"\n")
            self._lines.extend(lines)
        return self._lines.popleft().decode(errors="replace")

    def _failure(self, what: str, status: UpstreamStatus) -> UpstreamUnavailable:
        return UpstreamUnavailable(
            f"The upstream server {what}.", status=status, upstream=self.base_url
        )


async def open_stream(
    client: HTTPClient,
    base_url: str,
    request: UpstreamRequest,
    headers: dict[str, str],
    timeouts: UpstreamTimeouts,
) -> StreamCall:
    """Send `request` to `base_url` and read up to its first text; raises `AttemptFailed`,
    or `UpstreamRejected` when the upstream refuses the request itself."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    first_deadline = started + timeouts.first_token
    body = encode_json(request.body)
    try:
        response = await client.open("POST", base_url + request.path, headers, body, first_deadline)
    except TimeoutError as exc:
        raise AttemptFailed("sent no response in time", status=504, retryable=True) from exc
    except ConnectTimeout as exc:
        raise AttemptFailed(
            "did not accept the connection in time", status=504, retryable=True
        ) from exc
    except ConnectError as exc:
        raise AttemptFailed("refused the connection", status=503, retryable=True) from exc
    except TransportError as exc:
        raise AttemptFailed(
            f"dropped the connection ({describe(exc)})", status=502, retryable=True
        ) from exc
    call = StreamCall(
        base_url,
        response,
        AnswerReader(is_chat=request.is_chat),
        timeouts,
        started + timeouts.total,
    )
    try:
        await _check_status(call, first_deadline)
        await _read_to_first_text(call, first_deadline)
    except BaseException:
        await call.aclose()
        raise
    return call


async def _check_status(call: StreamCall, deadline: float) -> None:
    status = call.response.status
    if status == 200:
        return
    try:
        detail = (await call.response.read(deadline)).decode(errors="replace")
    except (TimeoutError, TransportError):
        detail = ""
    if 400 <= status < 500:
        raise UpstreamRejected(
            _error_message(detail) or f"the upstream server answered {status}",
            status=status if status in PASSED_ON_STATUSES else 400,
            upstream=call.base_url,
        )
    raise AttemptFailed(
        f"answered {status}: {_error_message(detail)[:200]}",
        status=502,
        retryable=status in RETRYABLE_STATUSES,
    )


async def _read_to_first_text(call: StreamCall, deadline: float) -> None:
    try:
        while not call.ended:
            # Not `idle`: a long prompt's prefill may take most of `first_token`.
            chunk = await call._next_chunk(min(deadline, call.total_deadline))
            if chunk is not None:
                call.first.append(chunk)
                return
    except TimeoutError as exc:
        raise AttemptFailed("sent no token in time", status=504, retryable=False) from exc
    except TransportError as exc:
        raise AttemptFailed(
            f"dropped the connection ({describe(exc)})", status=502, retryable=True
        ) from exc
    except (MalformedStream, UpstreamStreamError) as exc:
        raise AttemptFailed(f"sent a malformed stream: {exc}", status=502, retryable=False) from exc


def describe(exc: BaseException) -> str:
    """The exception's type and the first message down its causes (a `TimeoutError` says
    nothing; what it interrupted may)."""
    cause: BaseException | None = exc
    for _ in range(8):  # a cycle of causes is possible; the message is near the top
        if cause is None or str(cause):
            break
        cause = cause.__cause__ or cause.__context__
    if cause is None or not str(cause):
        return type(exc).__name__
    if cause is exc:
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {type(cause).__name__}: {cause}"


def _error_message(detail: str) -> str:
    """OpenAI's `{"error": {"message": ...}}`, or the body's start."""
    try:
        parsed = json.loads(detail)
    except ValueError:
        return detail.strip()[:500]
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return detail.strip()[:500]
