"""The engine's part of a generation as spans: its queue, its prefill and its decode.

The spans are made when the generation ends, from the times its deltas arrived: they
are never current, so an async generator that the route starts and the response
finishes (a stream) needs no context switched across its `yield`s.

- `engine.queue`: from the call into the engine until its scheduler admitted the
  request (tokenizing the prompt and waiting for a batch slot);
- `engine.prefill`: from admission to the first token (the prompt's forward passes and
  the first sample), as the engine reports it (`TokenDelta.prefill_s`);
- `engine.first_token` instead of both where the engine cannot split them (an upstream
  server) or no token came;
- `engine.decode`: from the first token to the last delta.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping

from opentelemetry import context as otel_context
from opentelemetry.trace import Status, StatusCode

from engine import TokenDelta
from gateway.tracing.stages import (
    CACHED_TOKENS,
    FINISH_REASONS,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    UPSTREAM,
    RequestTrace,
    annotate,
    current_request,
)


def traced_deltas(deltas: AsyncIterator[TokenDelta], choice: int = 0) -> AsyncIterator[TokenDelta]:
    """`deltas` as they come, timed into engine spans; `deltas` itself when not traced."""
    request = current_request()
    if request is None:
        return deltas
    return _EngineSpans(request, choice).follow(deltas)


class _EngineSpans:
    def __init__(self, request: RequestTrace, choice: int) -> None:
        self._request = request
        self._choice = choice
        self._parent = otel_context.get_current()
        self._started_ns = time.time_ns()
        self._first_ns: int | None = None
        self._prefill_s: float | None = None
        self._last: TokenDelta | None = None

    async def follow(self, deltas: AsyncIterator[TokenDelta]) -> AsyncIterator[TokenDelta]:
        error: BaseException | None = None
        try:
            async for delta in deltas:
                if self._first_ns is None:
                    self._first_ns, self._prefill_s = time.time_ns(), delta.prefill_s
                self._last = delta
                yield delta
        except BaseException as exc:  # recorded, then raised on: a refusal or a disconnect
            error = exc
            raise
        finally:
            if isinstance(deltas, AsyncGenerator):
                await deltas.aclose()  # abort the generation now, not when it is collected
            self._end(error)

    def _end(self, error: BaseException | None) -> None:
        ended_ns = time.time_ns()
        last = self._last
        if self._first_ns is None or last is None:
            self._span("engine.first_token", self._started_ns, ended_ns, {}, error)
            return
        first_ns = self._first_ns
        if self._prefill_s is None:
            self._span("engine.first_token", self._started_ns, first_ns, {}, None)
        else:
            admitted_ns = max(self._started_ns, first_ns - int(self._prefill_s * 1e9))
            self._span("engine.queue", self._started_ns, admitted_ns, {}, None)
            prefill = {INPUT_TOKENS: last.prompt_tokens, CACHED_TOKENS: last.cached_prompt_tokens}
            self._span("engine.prefill", admitted_ns, first_ns, prefill, None)
        decode: dict[str, int | str | list[str]] = {OUTPUT_TOKENS: last.completion_tokens}
        if last.finish_reason is not None:
            decode[FINISH_REASONS] = [last.finish_reason]
        if last.served_by:
            decode[UPSTREAM] = last.served_by
            annotate({UPSTREAM: last.served_by})
        self._span("engine.decode", first_ns, ended_ns, decode, error)

    def _span(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, int | str | list[str]],
        error: BaseException | None,
    ) -> None:
        span = self._request.tracer.start_span(
            name,
            context=self._parent,
            attributes={"bastion.choice": self._choice, **attributes},
            start_time=start_ns,
        )
        if isinstance(error, GeneratorExit | asyncio.CancelledError):
            span.set_attribute("bastion.engine.cancelled", True)
        elif error is not None:
            # The type only: an exception's message may quote the request.
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end(end_time=max(start_ns, end_ns))
