"""The Litestar application factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from litestar import Litestar
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig

from gateway.audit_routes import AUDIT_ROUTES
from gateway.errors import (
    ApiError,
    api_error_handler,
    http_exception_handler,
    internal_error_handler,
)
from gateway.request_context import add_request_id_header
from gateway.routes import chat_completions, healthz, list_models, readyz
from gateway.services import Services, load_services
from gateway.settings import Settings

log = structlog.get_logger(__name__)


def create_app(settings: Settings, services: Services | None = None) -> Litestar:
    """Build the app. Without `services`, they load in the background after start-up,
    so `/healthz` answers at once and `/readyz` turns ready when loading is done."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        task: asyncio.Task[None] | None = None
        if app.state.get("services") is None:
            task = asyncio.create_task(_load_in_background(app, settings))
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            loaded: Services | None = app.state.get("services")
            if loaded is not None:
                loaded.engine.close()

    return Litestar(
        route_handlers=[healthz, readyz, list_models, chat_completions, *AUDIT_ROUTES],
        lifespan=[lifespan],
        state=State({"services": services, "load_error": None}),
        exception_handlers={
            ApiError: api_error_handler,
            HTTPException: http_exception_handler,
            Exception: internal_error_handler,
        },
        before_send=[add_request_id_header],
        openapi_config=OpenAPIConfig(title="Bastion", version="0.1.0"),
    )


async def _load_in_background(app: Litestar, settings: Settings) -> None:
    try:
        app.state.services = await asyncio.to_thread(load_services, settings)
    except Exception as exc:
        log.exception("gateway.load_failed")
        app.state.load_error = f"{type(exc).__name__}: {exc}"
