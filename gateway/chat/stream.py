"""One streamed answer as server-sent events, with its audit record and token charge."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from sqlalchemy.exc import OperationalError

from gateway.audit.chain import AuditWriteError
from gateway.audit.log import AuditLog
from gateway.audit.request_audit import RequestAudit
from gateway.chat.logprob_release import LogprobRelease
from gateway.chat.openai_format import chunk_body, sse, usage_chunk_body
from gateway.chat.service import Answer, ChatService, PreparedChat
from gateway.chat.tool_stream import (
    CallFailed,
    CallStarted,
    TextPiece,
    ToolCallStream,
    ToolStreamEvent,
    tool_call_delta,
)
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
    streamed_calls: int = 0
    released_text: str = ""
    held: list[str] = field(default_factory=list)
    calls: ToolCallStream | None = field(init=False, default=None)
    logprobs: LogprobRelease | None = field(init=False, default=None)

    async def events(self) -> AsyncIterator[bytes]:
        entry = self.chat.entry
        try:
            # Events that are ready together go out in one write: each write is a send
            # system call and a wake-up of the client, the largest cost a chunk has.
            opening = [self._chunk({"role": "assistant", "content": ""}, citations=True)]
            released: list[str] = []
            if self.first is not None:
                self.metrics.ttft.observe(time.perf_counter() - self.audit.started)
                released.append(self.first)
                opening += self._released(self.first)
            yield b"".join(opening)
            async for text in self.texts:
                released.append(text)
                if events := self._released(text):
                    yield b"".join(events)
            if self.calls and (events := self._parsed(self.calls.close())):
                yield b"".join(events)
            answer = await self.service.finish(self.chat, "".join(released))
            closing = self._closing_events(answer)
            await self._record()
            yield b"".join(closing)
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

    def __post_init__(self) -> None:
        if self.chat.tools:
            self.calls = ToolCallStream()
        if self.chat.first.generation.sampling.logprobs:
            self.logprobs = LogprobRelease(self.chat.first)

    def _released(self, text: str) -> list[bytes]:
        """The chunks of text the output checks let through: content, or tool calls."""
        if self.calls is not None:
            return self._parsed(self.calls.feed(text))
        if self._holds(text):
            return []
        return [self._chunk({"content": text}, self._logprobs_for(text))]

    def _holds(self, text: str) -> bool:
        """A JSON answer that the output checks changed, or that no constrained decoding
        made valid (an upstream's), is held from there on: only the whole answer can show
        it meets the schema, and it is sent only if it does."""
        self.released_text += text
        shape = self.chat.shape
        if shape.json_answer and not self.held:
            raw = "".join(self.chat.first.answer_parts)
            if not shape.enforced or not raw.startswith(self.released_text):
                self.held.append("")
        if self.held:
            self.held.append(text)
        return bool(self.held)

    def _held_events(self, answer: Answer) -> list[bytes]:
        if not self.held:
            return []
        if answer.finish_reason == "content_filter":
            raise ApiError(
                422,
                answer.refusal or "The answer was withheld by the output checks.",
                code="answer_withheld",
            )
        text = "".join(self.held)
        return [self._chunk({"content": text}, self._logprobs_for(text))]

    def _parsed(self, events: list[ToolStreamEvent]) -> list[bytes]:
        chunks = []
        for event in events:
            cut = self.chat.first.finish_reason == "length"
            if isinstance(event, CallFailed) and event.index is not None and cut:
                continue  # max_tokens ended it: the answer says `length`
            if isinstance(event, CallFailed) and event.index is not None:
                # The client saw this call start: it cannot be taken back, only failed.
                raise ApiError(
                    500,
                    f"The model wrote a tool call that is not valid: {event.reason}.",
                    type="server_error",
                    code="invalid_tool_call",
                )
            if isinstance(event, CallFailed):
                event = TextPiece(event.text)
            if isinstance(event, CallStarted):
                self.streamed_calls += 1
            delta = tool_call_delta(event)
            if delta is not None:
                text = event.text if isinstance(event, TextPiece) else ""
                chunks.append(self._chunk(delta, self._logprobs_for(text)))
        return chunks

    def _logprobs_for(self, text: str) -> dict[str, Any] | None:
        return None if self.logprobs is None else self.logprobs.release(text)

    def _chunk(
        self,
        delta: dict[str, object],
        logprobs: dict[str, Any] | None = None,
        *,
        citations: bool = False,
    ) -> bytes:
        body = chunk_body(self.chat, delta, with_usage_field=self.with_usage, logprobs=logprobs)
        return sse(body | {"citations": self.chat.citations()} if citations else body)

    def _closing_events(self, answer: Answer) -> list[bytes]:
        closing: list[bytes] = self._held_events(answer)
        if self.streamed_calls and not answer.tool_calls and answer.finish_reason != "length":
            # The calls went out but failed validation over the whole answer (a call that
            # max_tokens cut ends with `length` instead).
            raise ApiError(
                500,
                "The tool call the model wrote failed validation: "
                + "; ".join(
                    v
                    for verdict in self.chat.entry.verdicts
                    if verdict.blocks
                    for v in verdict.evidence
                ),
                type="server_error",
                code="invalid_tool_call",
            )
        rest = self.logprobs.rest() if self.logprobs is not None else None
        if rest is not None and rest["content"]:
            closing.append(self._chunk({}, rest))
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
