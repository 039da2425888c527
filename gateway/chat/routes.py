"""HTTP handlers for the OpenAI-compatible API and the health probes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog
from litestar import Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.response import Stream
from sqlalchemy.exc import OperationalError

from gateway.audit.log import AuditEntry
from gateway.audit.chain import AuditWriteError
from gateway.http.auth import CHAT_ROLES, identify, services_of
from gateway.http.body import read_json
from gateway.chat.service import ChatService, PreparedChat
from gateway.db.connection import database_reachable
from gateway.http.errors import ApiError, database_unavailable
from gateway.keys.store import KeyIdentity
from gateway.http.metrics import GatewayMetrics
from gateway.chat.openai_format import chunk_body, completion_body, sse, usage_chunk_body
from gateway.http.openapi_docs import documented, errors
from gateway.policy.schema import RateLimits
from gateway.policy.registry import NoPolicyError
from gateway.limits.quotas import admit, charge_tokens
from gateway.http.request_context import request_id_of
from gateway.chat.schemas import ChatCompletionRequest
from gateway.services import PolicyRuntime, Services

log = structlog.get_logger(__name__)
CHAT_PATH = "/v1/chat/completions"


def policy_for(services: Services, identity: KeyIdentity) -> PolicyRuntime:
    """Fail closed: a caller with no bound policy is refused, never served unchecked."""
    try:
        return services.policies.for_identity(identity)
    except NoPolicyError as exc:
        raise ApiError(403, str(exc), type="permission_error", code="no_policy") from exc


@get("/healthz", sync_to_thread=False)
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz")
async def readyz(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """Ready when the models are loaded and the database answers (so answers can be audited)."""
    services: Services | None = request.app.state.get("services")
    failure: str | None = request.app.state.get("load_error")
    if services is None:
        body = {"status": "failed" if failure else "loading", "error": failure}
        return Response(body, status_code=503)
    if not await asyncio.to_thread(database_reachable, services.sessions):
        return Response(
            {"status": "database_unreachable", "error": "the database does not answer"},
            status_code=503,
        )
    return Response(
        {
            "status": "ready",
            "model": services.engine.model_id,
            "policies": {p.policy.name: p.version for p in services.policies.loaded()},
        }
    )


@get("/v1/models", operation_class=documented(), responses=errors())
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = services_of(request)
    await identify(request, services, CHAT_ROLES)
    return {
        "object": "list",
        "data": [
            {"id": services.engine.model_id, "object": "model", "created": 0, "owned_by": "bastion"}
        ],
    }


@post(
    CHAT_PATH,
    status_code=200,
    operation_class=documented(ChatCompletionRequest),
    responses=errors(400, 404, 413, 415, 429),
)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    entry = AuditEntry(request_id=request_id_of(request.scope), endpoint=CHAT_PATH)
    started = time.perf_counter()
    services = services_of(request)
    streaming = False
    try:
        identity = await identify(request, services, CHAT_ROLES, audit_denials=False)
        entry.tenant, entry.key_id = identity.tenant, identity.key_id
        runtime = policy_for(services, identity)
        limits = runtime.loaded.policy.rate_limits
        await asyncio.to_thread(admit, services.limiter, identity, limits)
        body = await read_json(request, ChatCompletionRequest)
        service = ChatService(services, runtime)
        chat = await service.prepare(body, entry)
        if body.stream:
            # Wait for the first text before the response starts, so that a refusal by
            # the engine (overloaded) is still an HTTP error rather than a stream event.
            texts = service.stream_text(chat)
            first = await anext(texts, None)
            streaming = True
            return Stream(
                _event_stream(
                    service,
                    chat,
                    body,
                    services,
                    started,
                    identity,
                    limits,
                    request.app.state.metrics,
                    texts,
                    first,
                ),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        answer = await service.complete(chat)
        charge_tokens(
            services.limiter, identity, limits, answer.prompt_tokens + answer.completion_tokens
        )
        overhead = (time.perf_counter() - started) * 1000 - entry.engine_ms
        return Response(
            completion_body(chat, answer),
            status_code=200,
            headers={"x-bastion-overhead-ms": f"{overhead:.1f}"},
        )
    except ApiError as error:
        entry.status_code = error.status
        entry.error_code = error.code
        if entry.outcome != "blocked":
            entry.outcome = "rejected" if error.status < 500 else "error"
        raise
    except HTTPException as error:  # raised by Litestar itself, e.g. 413 for a huge body
        entry.status_code = error.status_code
        entry.outcome = "rejected" if error.status_code < 500 else "error"
        raise
    finally:
        if not streaming:
            entry.latency_ms = (time.perf_counter() - started) * 1000
            await asyncio.to_thread(services.audit.record, entry)
            request.app.state.metrics.observe(entry)


async def _event_stream(
    service: ChatService,
    chat: PreparedChat,
    body: ChatCompletionRequest,
    services: Services,
    started: float,
    identity: KeyIdentity,
    limits: RateLimits,
    metrics: GatewayMetrics,
    texts: AsyncIterator[str],
    first: str | None,
) -> AsyncIterator[bytes]:
    """SSE events for one answer. The audit record is written before the closing events,
    so a client that has read `[DONE]` finds it; a disconnect is recorded as cancelled."""
    entry = chat.entry
    with_usage = body.include_usage
    recorded = False

    async def record() -> None:
        nonlocal recorded
        recorded = True
        used = entry.prompt_tokens + entry.completion_tokens
        await asyncio.to_thread(charge_tokens, services.limiter, identity, limits, used)
        entry.latency_ms = (time.perf_counter() - started) * 1000
        await asyncio.to_thread(services.audit.record, entry)
        metrics.observe(entry)

    try:
        yield sse(
            chunk_body(chat, {"role": "assistant", "content": ""}, with_usage_field=with_usage)
            | {"citations": chat.citations()}
        )
        released: list[str] = []
        if first is not None:
            metrics.ttft.observe(time.perf_counter() - started)
            released.append(first)
            yield sse(chunk_body(chat, {"content": first}, with_usage_field=with_usage))
        async for text in texts:
            released.append(text)
            yield sse(chunk_body(chat, {"content": text}, with_usage_field=with_usage))
        answer = await service.finish(chat, "".join(released))
        closing: list[bytes] = []
        if chat.tools and answer.tool_calls:
            calls = [call | {"index": i} for i, call in enumerate(answer.tool_calls)]
            closing.append(
                sse(chunk_body(chat, {"tool_calls": calls}, with_usage_field=with_usage))
            )
        elif chat.tools and answer.content:
            delta = {"content": answer.content}
            closing.append(sse(chunk_body(chat, delta, with_usage_field=with_usage)))
        closing.append(sse(chunk_body(chat, {}, answer.finish_reason, with_usage_field=with_usage)))
        if with_usage:
            closing.append(sse(usage_chunk_body(chat, answer)))
        closing.append(sse("[DONE]"))
        await record()
        for event in closing:
            yield event
    except (OperationalError, AuditWriteError):
        # The record could not be written: end with an error instead of `[DONE]`.
        log.exception("chat.stream_unaudited", request_id=entry.request_id)
        yield sse(database_unavailable().body())
    except ApiError as error:
        entry.status_code, entry.error_code, entry.outcome = error.status, error.code, "error"
        await record()
        yield sse(error.body())
    except Exception:
        log.exception("chat.stream_failed", request_id=entry.request_id)
        entry.status_code, entry.outcome = 500, "error"
        await record()
        yield sse(
            ApiError(500, "The server had an error while streaming.", type="server_error").body()
        )
    finally:
        # A disconnect cancels this generator; the shield lets the abort and the record finish.
        with anyio.CancelScope(shield=True):
            await texts.aclose()  # type: ignore[attr-defined]
            if not recorded:
                entry.outcome, entry.status_code = "cancelled", 499
                await record()
