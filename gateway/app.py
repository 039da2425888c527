"""The Litestar application factory."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from litestar import Litestar
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig
from opentelemetry.trace import TracerProvider

from gateway.audit.review_page import REVIEW_PAGE_ROUTER
from gateway.audit.routes import AUDIT_ROUTER
from gateway.chat.routes import CHAT_PATH, CHAT_ROUTER
from gateway.completions.routes import COMPLETIONS_PATH, COMPLETIONS_ROUTER
from gateway.documents.routes import DOCUMENT_ROUTER
from gateway.embeddings.routes import EMBEDDINGS_PATH, EMBEDDINGS_ROUTER
from gateway.guardrails_check.routes import GUARDRAILS_CHECK_ROUTER
from gateway.heap_trim import trim_heap_periodically
from gateway.http.auth import DEPENDENCIES
from gateway.http.drain import Drain, refuse_while_draining
from gateway.http.exception_handlers import EXCEPTION_HANDLERS
from gateway.http.metrics import GatewayMetrics, count_response, metrics_endpoint
from gateway.http.openapi_docs import COMPONENTS
from gateway.http.probes import PROBE_ROUTES
from gateway.http.request_context import add_request_id_header, bind_log_context
from gateway.http.request_limits import refuse_large_headers
from gateway.keys.routes import KEY_ROUTER
from gateway.policy.routes import POLICY_ROUTER
from gateway.services import Services, load_services
from gateway.settings import Settings
from gateway.tracing import trace_requests, tracer_provider_from_env

log = structlog.get_logger(__name__)


def create_app(
    settings: Settings,
    services: Services | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Litestar:
    """Build the app. Without `services`, they load in the background after start-up,
    so `/healthz` answers at once and `/readyz` turns ready when loading is done.
    Without `tracer_provider`, the `OTEL_*` variables decide whether requests are traced
    (not by default)."""
    owned_provider = None if tracer_provider is not None else tracer_provider_from_env()
    tracing = tracer_provider or owned_provider

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        if app.state.get("services") is None:
            tasks.append(asyncio.create_task(_load_in_background(app, settings)))
        if settings.policy_reload_seconds > 0:
            tasks.append(asyncio.create_task(_watch_policies(app, settings)))
        if settings.heap_trim_seconds > 0:
            tasks.append(asyncio.create_task(trim_heap_periodically(settings.heap_trim_seconds)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            loaded: Services | None = app.state.get("services")
            if loaded is not None:
                loaded.models.close()
                if loaded.engine is not None:
                    loaded.engine.close()
            if owned_provider is not None:
                owned_provider.shutdown()  # exports the spans still batched
            # The interpreter's last collection frees what the load froze (native
            # libraries report objects still alive at exit as leaks).
            gc.unfreeze()

    return Litestar(
        route_handlers=[
            *PROBE_ROUTES,
            metrics_endpoint,
            CHAT_ROUTER,
            COMPLETIONS_ROUTER,
            EMBEDDINGS_ROUTER,
            GUARDRAILS_CHECK_ROUTER,
            AUDIT_ROUTER,
            REVIEW_PAGE_ROUTER,
            KEY_ROUTER,
            POLICY_ROUTER,
            DOCUMENT_ROUTER,
        ],
        dependencies=DEPENDENCIES,
        # Outermost first: the log context, the request's span, the drain's gate, then the
        # header limit, before any guard runs.
        middleware=[
            bind_log_context,
            *([trace_requests(tracing)] if tracing is not None else []),
            refuse_while_draining,
            refuse_large_headers,
        ],
        lifespan=[lifespan],
        state=State(
            {
                "services": services,
                "load_error": None,
                "metrics": GatewayMetrics(),
                "drain": Drain(model_paths=(CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH)),
            }
        ),
        exception_handlers=EXCEPTION_HANDLERS,
        before_send=[add_request_id_header, count_response],
        openapi_config=OpenAPIConfig(title="Bastion", version="0.1.0", components=COMPONENTS),
    )


async def _load_in_background(app: Litestar, settings: Settings) -> None:
    try:
        services = await asyncio.to_thread(load_services, settings)
    except Exception as exc:
        log.exception("gateway.load_failed")
        app.state.load_error = f"{type(exc).__name__}: {exc}"
        return
    # What loading made (models, tokenizers, spaCy, presidio: millions of objects) lives as
    # long as the server. Frozen, the collector never walks it again; unfrozen, each full
    # collection walks it all and stops every stream on the loop for about 300 ms.
    gc.freeze()
    app.state.services = services


async def _watch_policies(app: Litestar, settings: Settings) -> None:
    """Hot reload: look for edited policy files and swap valid ones in."""
    while True:
        await asyncio.sleep(settings.policy_reload_seconds)
        services: Services | None = app.state.get("services")
        if services is None:
            continue
        try:
            await asyncio.to_thread(services.policies.reload)
        except Exception:
            log.exception("policy.watch_failed")
        try:  # the models file on the same beat; a bad edit keeps the last good one
            await asyncio.to_thread(services.models.reload)
            await services.models.start_new()
        except Exception:
            log.exception("models.watch_failed")
