"""Who is calling and whether their role may use the endpoint."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request

from gateway.audit.log import AuditEntry
from gateway.http.errors import ApiError, unauthorized
from gateway.keys.store import KeyIdentity, authenticate
from gateway.http.request_context import bearer_token, request_id_of
from gateway.services import Services


def services_of(request: Request[Any, Any, Any]) -> Services:
    """The loaded services, or a 503 while they are still loading."""
    services: Services | None = request.app.state.get("services")
    if services is None:
        raise ApiError(
            503,
            "Bastion is still loading its models; retry shortly.",
            type="server_error",
            code="not_ready",
            headers={"retry-after": "5"},
        )
    return services


async def identify(
    request: Request[Any, Any, Any],
    services: Services,
    roles: frozenset[str],
    audit_denials: bool = True,
) -> KeyIdentity:
    """The caller's identity; 401 without a valid key, 403 when the role may not call.

    Each denial is audited (`auth.denied`) unless the caller audits the request itself.
    """
    token = bearer_token(request.headers)
    identity = None
    if token is None:
        error = unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
        )
    else:
        identity = await asyncio.to_thread(authenticate, services.sessions, token)
        error = unauthorized(f"Incorrect API key provided: {token[:6]}****.")
    if identity is not None and identity.role in roles:
        return identity
    if identity is not None:
        error = ApiError(
            403,
            f"A key with role '{identity.role}' may not call this endpoint "
            f"(allowed: {', '.join(sorted(roles))}).",
            type="permission_error",
            code="insufficient_role",
        )
    if audit_denials:
        entry = AuditEntry(
            request_id=request_id_of(request.scope),
            endpoint=f"{request.method} {request.url.path}",
            event="auth.denied",
            tenant=identity.tenant if identity else None,
            key_id=identity.key_id if identity else None,
            outcome="denied",
            status_code=error.status,
            error_code=error.code,
        )
        await asyncio.to_thread(services.audit.record, entry)
    raise error


CHAT_ROLES = frozenset({"user", "admin"})
AUDIT_ROLES = frozenset({"auditor"})
ADMIN_ROLES = frozenset({"admin"})
