"""One streamed text completion as server-sent events."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from gateway.completions.openai_format import choice_body, chunk_body, usage_chunk_body
from gateway.completions.service import CompletionService, Piece, PreparedCompletion
from gateway.http.event_stream import StreamRecord, sse
from gateway.http.metrics import GatewayMetrics


@dataclass
class CompletionStream:
    """The chunks of one request's choices, interleaved as they come, then each choice's
    `finish_reason`, the usage when asked for, and `[DONE]`. The record is written
    before those closing events, so a client that has read `[DONE]` finds it."""

    service: CompletionService
    prepared: PreparedCompletion
    record: StreamRecord
    metrics: GatewayMetrics
    started: float
    with_usage: bool
    pieces: AsyncGenerator[Piece, None]
    first: Piece | None
    released: dict[int, str] = field(default_factory=dict)

    async def events(self) -> AsyncGenerator[bytes, None]:
        try:
            if self.prepared.echo:
                for choice in self.prepared.choices:
                    yield self._chunk(choice_body(choice.index, choice.prompt, None, None))
            if self.first is not None:
                self.metrics.ttft.observe(time.perf_counter() - self.started)
                yield self._released(self.first)
            async for piece in self.pieces:
                yield self._released(piece)
            results = await self.service.finish(self.prepared, self.released)
            closing = [
                self._chunk(choice_body(r.index, "", None, r.finish_reason)) for r in results
            ]
            if self.with_usage:
                closing.append(sse(usage_chunk_body(self.prepared)))
            closing.append(sse("[DONE]"))
            await self.record.record()
            for event in closing:
                yield event
        finally:
            await self.pieces.aclose()

    def _released(self, piece: Piece) -> bytes:
        self.released[piece.index] = self.released.get(piece.index, "") + piece.text
        return self._chunk(choice_body(piece.index, piece.text, piece.logprobs, None))

    def _chunk(self, choice: dict[str, object]) -> bytes:
        return sse(chunk_body(self.prepared, [choice], with_usage_field=self.with_usage))
