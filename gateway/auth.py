"""Who is calling and whether their role may use the endpoint."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request

from gateway.errors import ApiError, unauthorized
from gateway.keys import KeyIdentity, authenticate
from gateway.request_context import bearer_token
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
    request: Request[Any, Any, Any], services: Services, roles: frozenset[str]
) -> KeyIdentity:
    """The caller's identity; 401 without a valid key, 403 when the role may not call."""
    token = bearer_token(request.headers)
    if token is None:
        raise unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
        )
    identity = await asyncio.to_thread(authenticate, services.sessions, token)
    if identity is None:
        raise unauthorized(f"Incorrect API key provided: {token[:6]}****.")
    if identity.role not in roles:
        raise ApiError(
            403,
            f"A key with role '{identity.role}' may not call this endpoint "
            f"(allowed: {', '.join(sorted(roles))}).",
            type="permission_error",
            code="insufficient_role",
        )
    return identity


CHAT_ROLES = frozenset({"user", "admin"})
AUDIT_ROLES = frozenset({"auditor"})
ADMIN_ROLES = frozenset({"admin"})
