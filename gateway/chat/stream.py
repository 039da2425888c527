"""One streamed answer as server-sent events, with its audit record and token charge."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import structlog
from sqlalchemy.exc import OperationalError

from gateway.audit.chain import AuditWriteError
from gateway.audit.log import AuditLog
from gateway.audit.request_audit import RequestAudit
from gateway.chat.openai_format import chunk_body, sse, usage_chunk_body
from gateway.chat.service import Answer, ChatService, PreparedChat
from gateway.http.errors import ApiError, database_unavailable
from gateway.http.metrics import GatewayMetrics
from gateway.keys.store import KeyIdentity

log = structlog.get_logger(__name__)


@dataclass
class AnswerStream:
    """The events of one answer. The audit record is written before the closing events,
    so a client that has read `[DONE]` finds it; a disconnect is recorded as cancelled."""

    service: ChatService
    chat: PreparedChat
    identity: KeyIdentity
    audit: RequestAudit
    audit_log: AuditLog
    metrics: GatewayMetrics
    with_usage: bool
    texts: AsyncIterator[str]
    first: str | None
    recorded: bool = False

    async def events(self) -> AsyncIterator[bytes]:
        entry = self.chat.entry
        try:
            yield self._chunk({"role": "assistant", "content": ""}, citations=True)
            released: list[str] = []
            if self.first is not None:
                self.metrics.ttft.observe(time.perf_counter() - self.audit.started)
                released.append(self.first)
                yield self._chunk({"content": self.first})
            async for text in self.texts:
                released.append(text)
                yield self._chunk({"content": text})
            answer = await self.service.finish(self.chat, "".join(released))
            closing = self._closing_events(answer)
            await self._record()
            for event in closing:
                yield event
        except (OperationalError, AuditWriteError):
            # The record could not be written: end with an error instead of `[DONE]`.
            log.exception("chat.stream_unaudited", request_id=entry.request_id)
            yield sse(database_unavailable().body())
        except ApiError as error:
            entry.status_code, entry.error_code, entry.outcome = error.status, error.code, "error"
            await self._record()
            yield sse(error.body())
        except Exception:
            log.exception("chat.stream_failed", request_id=entry.request_id)
            entry.status_code, entry.outcome = 500, "error"
            await self._record()
            yield sse(
                ApiError(
                    500, "The server had an error while streaming.", type="server_error"
                ).body()
            )
        finally:
            # A disconnect cancels this generator; the shield lets the abort and the record finish.
            with anyio.CancelScope(shield=True):
                await self.texts.aclose()  # type: ignore[attr-defined]
                if not self.recorded:
                    entry.outcome, entry.status_code = "cancelled", 499
                    await self._record()

    def _chunk(self, delta: dict[str, object], *, citations: bool = False) -> bytes:
        body = chunk_body(self.chat, delta, with_usage_field=self.with_usage)
        return sse(body | {"citations": self.chat.citations()} if citations else body)

    def _closing_events(self, answer: Answer) -> list[bytes]:
        closing: list[bytes] = []
        if self.chat.tools and answer.tool_calls:
            calls = [call | {"index": i} for i, call in enumerate(answer.tool_calls)]
            closing.append(self._chunk({"tool_calls": calls}))
        elif self.chat.tools and answer.content:
            closing.append(self._chunk({"content": answer.content}))
        closing.append(
            sse(chunk_body(self.chat, {}, answer.finish_reason, with_usage_field=self.with_usage))
        )
        if self.with_usage:
            closing.append(sse(usage_chunk_body(self.chat, answer)))
        closing.append(sse("[DONE]"))
        return closing

    async def _record(self) -> None:
        self.recorded = True
        await self.service.charge(self.identity, self.chat)
        await self.audit.write(self.audit_log, self.metrics)
