"""The audit record of an admin action taken over HTTP."""

from __future__ import annotations

from typing import Any

from litestar import Request

from gateway.audit.entries import admin_action_entry, key_actor
from gateway.http.request_context import request_id_of
from gateway.keys.store import KeyIdentity
from gateway.services import Services


async def audit_admin_request(
    request: Request[Any, Any, Any],
    services: Services,
    admin: KeyIdentity,
    event: str,
    **details: Any,
) -> None:
    """One record naming the admin's key, under the request's own id."""
    status = request.route_handler.status_code or 200
    entry = admin_action_entry(
        event=event,
        actor=key_actor(admin.key_id),
        endpoint=request.url.path,
        tenant=admin.tenant,
        key_id=admin.key_id,
        status_code=status,
        request_id=request_id_of(request.scope),
        details=details,
    )
    await services.audit.record_async(entry)
