"""One server span per HTTP request, continuing the caller's trace (`traceparent`).

Probes and `/metrics` are not traced: orchestrators call them every few seconds and
their spans would bury the requests. The span is named `METHOD route` (the route's
template, so `/v1/documents/{id}` stays one name) and ends when the response has been
sent, a stream's last event included. It runs inside `bind_log_context`, so the
request's log lines carry its `trace_id`. No query string, client address or header value
other than the trace context is recorded.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPScope, Message, Receive, Scope, Send
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider

from gateway.http.request_context import request_id_of
from gateway.tracing.stages import REQUEST_ID, RequestTrace, serving

UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
INSTRUMENTATION_NAME = "bastion"


def trace_requests(provider: TracerProvider) -> Callable[[ASGIApp], ASGIApp]:
    """App middleware: the server span of every HTTP request but the probes."""
    tracer = provider.get_tracer(INSTRUMENTATION_NAME)

    def middleware(app: ASGIApp) -> ASGIApp:
        async def traced(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP or scope["path"] in UNTRACED_PATHS:
                await app(scope, receive, send)
                return
            await _serve_traced(tracer, app, scope, receive, send)

        return traced

    return middleware


async def _serve_traced(
    tracer: Tracer, app: ASGIApp, scope: HTTPScope, receive: Receive, send: Send
) -> None:
    method = scope["method"]
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
    with tracer.start_as_current_span(
        method,
        context=propagate.extract(headers),
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": method,
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
            REQUEST_ID: request_id_of(scope),
        },
    ) as span:
        # After `bind_log_context`: the request's log lines name its trace.
        structlog.contextvars.bind_contextvars(
            trace_id=format(span.get_span_context().trace_id, "032x")
        )

        async def send_noting_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        try:
            with serving(RequestTrace(tracer, span)):
                await app(scope, receive, send_noting_status)
        finally:
            route = scope.get("path_template")
            if route:
                span.set_attribute("http.route", route)
                span.update_name(f"{method} {route}")
