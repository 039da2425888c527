"""The OpenAI-compatible routes: `/v1/models` and `/v1/chat/completions`."""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.params import JSONBody
from litestar.response import Stream

from gateway.audit.request_audit import audit_every_request, caller_audit
from gateway.chat.openai_format import completion_body
from gateway.chat.schemas import ChatCompletionRequest, ModelList
from gateway.chat.service import ChatService
from gateway.chat.stream import AnswerStream
from gateway.http.auth import CHAT_ROLES, IdentityDep, ServicesDep, require_roles
from gateway.http.guards import MODEL_CALL_GUARD
from gateway.http.openapi_docs import BEARER_SECURITY, errors
from gateway.policy.runtime import policy_for

CHAT_PATH = "/v1/chat/completions"


@get("/models", guards=[require_roles(CHAT_ROLES)], responses=errors())
async def list_models(services: ServicesDep) -> ModelList:
    return ModelList.of(services.models.engines())


@post(
    "/chat/completions",
    status_code=200,
    # Every request is audited once by the middleware, denials included.
    guards=[MODEL_CALL_GUARD],
    middleware=[audit_every_request(CHAT_PATH)],
    responses=errors(400, 404, 413, 415, 429, 502, 504),
)
async def chat_completions(
    request: Request[Any, Any, Any],
    data: JSONBody[ChatCompletionRequest],
    services: ServicesDep,
    identity: IdentityDep,
) -> Response[Any]:
    audit = caller_audit(request.scope, identity)
    entry = audit.entry
    service = ChatService(services, policy_for(services.policies, identity))
    chat = await service.prepare(data, entry)
    if data.stream:
        # Wait for the first text before the response starts, so that a refusal by
        # the engine (overloaded) is still an HTTP error rather than a stream event.
        texts = service.stream_text(chat)
        first = await anext(texts, None)
        audit.streamed = True
        stream = AnswerStream(
            service,
            chat,
            identity,
            audit,
            services.audit,
            request.app.state.metrics,
            data.include_usage,
            texts,
            first,
        )
        return Stream(
            stream.events(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    answers = await service.complete(chat)
    await service.charge(identity, chat)
    overhead = (time.perf_counter() - audit.started) * 1000 - entry.engine_ms
    return Response(
        completion_body(chat, answers),
        status_code=200,
        headers={"x-bastion-overhead-ms": f"{overhead:.1f}"},
    )


CHAT_ROUTER = Router(
    path="/v1",
    route_handlers=[list_models, chat_completions],
    security=BEARER_SECURITY,
    tags=["chat"],
)
