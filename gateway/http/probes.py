"""The health probes: alive (`/healthz`) and ready to serve (`/readyz`)."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request, Response, get

from gateway.db.connection import database_reachable
from gateway.http.drain import Drain
from gateway.services import Services


@get("/healthz", sync_to_thread=False)
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz")
async def readyz(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """Ready when the models are loaded and the database answers (so answers can be audited);
    not ready from the moment a drain begins, so that the replica leaves rotation."""
    drain: Drain = request.app.state.drain
    if drain.draining:
        body = {"status": "draining", "in_flight": drain.in_flight}
        return Response(body, status_code=503)
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
            "model": services.engine.model_id if services.engine is not None else None,
            "models": services.models.model_ids(),
            "policies": {p.policy.name: p.version for p in services.policies.loaded()},
        }
    )


PROBE_ROUTES = [healthz, readyz]
