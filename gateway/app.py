"""The Litestar application factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from litestar import Litestar, Request
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from sqlalchemy.exc import OperationalError

from gateway.keys.routes import ADMIN_ROUTES
from gateway.audit.chain import AuditWriteError
from gateway.audit.routes import AUDIT_ROUTES
from gateway.documents.routes import DOCUMENT_ROUTES
from gateway.http.errors import (
    ApiError,
    api_error_handler,
    database_error_handler,
    http_exception_handler,
    internal_error_handler,
)
from gateway.http.metrics import GatewayMetrics, count_response, metrics_endpoint
from gateway.http.openapi_docs import COMPONENTS
from gateway.http.request_context import add_request_id_header, bind_log_context
from gateway.http.request_limits import refuse_large_headers
from gateway.audit.review_page import REVIEW_PAGE_ROUTES
from gateway.chat.routes import chat_completions, healthz, list_models, readyz
from gateway.services import Services, load_services
from gateway.settings import Settings

log = structlog.get_logger(__name__)


def create_app(settings: Settings, services: Services | None = None) -> Litestar:
    """Build the app. Without `services`, they load in the background after start-up,
    so `/healthz` answers at once and `/readyz` turns ready when loading is done."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        tasks: list[asyncio.Task[None]] = []
        if app.state.get("services") is None:
            tasks.append(asyncio.create_task(_load_in_background(app, settings)))
        if settings.policy_reload_seconds > 0:
            tasks.append(asyncio.create_task(_watch_policies(app, settings)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            loaded: Services | None = app.state.get("services")
            if loaded is not None:
                loaded.engine.close()

    return Litestar(
        route_handlers=[
            healthz,
            readyz,
            list_models,
            chat_completions,
            metrics_endpoint,
            *AUDIT_ROUTES,
            *ADMIN_ROUTES,
            *DOCUMENT_ROUTES,
            *REVIEW_PAGE_ROUTES,
        ],
        lifespan=[lifespan],
        state=State({"services": services, "load_error": None, "metrics": GatewayMetrics()}),
        exception_handlers={
            ApiError: api_error_handler,
            HTTPException: http_exception_handler,
            OperationalError: database_error_handler,
            AuditWriteError: database_error_handler,
            Exception: internal_error_handler,
        },
        before_send=[add_request_id_header, count_response],
        before_request=_before_request,
        openapi_config=OpenAPIConfig(title="Bastion", version="0.1.0", components=COMPONENTS),
    )


async def _before_request(request: Request[Any, Any, Any]) -> None:
    """The log context first, so that a refusal is logged with its request id."""
    await bind_log_context(request)
    await refuse_large_headers(request)


async def _load_in_background(app: Litestar, settings: Settings) -> None:
    try:
        app.state.services = await asyncio.to_thread(load_services, settings)
    except Exception as exc:
        log.exception("gateway.load_failed")
        app.state.load_error = f"{type(exc).__name__}: {exc}"


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
