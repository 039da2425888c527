"""OpenAI's legacy text completions: `POST /v1/completions`."""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, Response, Router, post
from litestar.params import JSONBody
from litestar.response import Stream

from gateway.audit.request_audit import audit_every_request, caller_audit
from gateway.completions.openai_format import completion_body
from gateway.completions.schemas import CompletionRequest
from gateway.completions.service import CompletionService
from gateway.completions.stream import CompletionStream
from gateway.http.auth import IdentityDep, ServicesDep
from gateway.http.event_stream import StreamRecord
from gateway.http.guards import MODEL_CALL_GUARD
from gateway.http.openapi_docs import BEARER_SECURITY, errors
from gateway.policy.runtime import policy_for

COMPLETIONS_PATH = "/v1/completions"


@post(
    "/completions",
    status_code=200,
    # Every request is audited once by the middleware, denials included.
    guards=[MODEL_CALL_GUARD],
    middleware=[audit_every_request(COMPLETIONS_PATH, event="text_completion")],
    responses=errors(400, 404, 413, 415, 429, 502, 504),
)
async def completions(
    request: Request[Any, Any, Any],
    data: JSONBody[CompletionRequest],
    services: ServicesDep,
    identity: IdentityDep,
) -> Response[Any]:
    audit = caller_audit(request.scope, identity)
    entry = audit.entry
    service = CompletionService(services, policy_for(services.policies, identity))
    prepared = await service.prepare(data, entry)
    metrics = request.app.state.metrics
    if data.stream:
        # Wait for the first text before the response starts, so that a refusal by
        # the engine (overloaded) is still an HTTP error rather than a stream event.
        pieces = service.stream(prepared)
        first = await anext(pieces, None)
        audit.streamed = True

        async def write_record() -> None:
            await service.charge(identity, prepared)
            await audit.write(services.audit, metrics)

        record = StreamRecord(entry, write_record)
        stream = CompletionStream(
            service, prepared, record, metrics, audit.started, data.include_usage, pieces, first
        )
        return Stream(
            record.guarded(stream.events()),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    results = await service.complete(prepared)
    await service.charge(identity, prepared)
    overhead = (time.perf_counter() - audit.started) * 1000 - entry.engine_ms
    return Response(
        completion_body(prepared, results),
        status_code=200,
        headers={"x-bastion-overhead-ms": f"{overhead:.1f}"},
    )


COMPLETIONS_ROUTER = Router(
    path="/v1",
    route_handlers=[completions],
    security=BEARER_SECURITY,
    tags=["completions"],
)
