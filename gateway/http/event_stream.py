"""Server-sent events for streamed answers, and the one audit record every stream owes:
written by the stream itself before its closing events, else before the error event
that ends a failed stream, else (the client went away) as cancelled."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from sqlalchemy.exc import OperationalError

from gateway.audit.chain import AuditWriteError
from gateway.audit.log import AuditEntry
from gateway.http.errors import ApiError, database_unavailable

log = structlog.get_logger(__name__)


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


@dataclass
class StreamRecord:
    """Writes a streamed request's entry exactly once; `write` charges and records it."""

    entry: AuditEntry
    write: Callable[[], Awaitable[None]]
    written: bool = False

    async def record(self) -> None:
        self.written = True
        await self.write()

    async def guarded(self, events: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
        """`events`, ended by an error event in OpenAI's shape instead of `[DONE]` when
        they fail, or when their record cannot be written."""
        entry = self.entry
        try:
            async for event in events:
                yield event
        except (OperationalError, AuditWriteError):
            log.exception("stream.unaudited", request_id=entry.request_id)
            yield sse(database_unavailable().body())
        except ApiError as error:
            entry.status_code, entry.error_code, entry.outcome = error.status, error.code, "error"
            await self.record()
            yield sse(error.body())
        except Exception:
            log.exception("stream.failed", request_id=entry.request_id)
            entry.status_code, entry.outcome = 500, "error"
            await self.record()
            failed = ApiError(500, "The server had an error while streaming.", type="server_error")
            yield sse(failed.body())
        finally:
            # A disconnect cancels this generator; the shield lets the abort and the record finish.
            with anyio.CancelScope(shield=True):
                await events.aclose()
                if not self.written:
                    entry.outcome, entry.status_code = "cancelled", 499
                    await self.record()
