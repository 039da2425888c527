"""Who is calling and whether their role may use the route: one guard and two dependencies
that every route shares.

Authentication is a guard because Litestar runs guards before it reads the body, so a
caller without a valid key gets 401, never a 400 about a body it may not send.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypeAlias

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.di import Dependency, Provide
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard

from gateway.audit.entries import refusal_entry
from gateway.db.connection import is_sqlite
from gateway.http.errors import ApiError, unauthorized
from gateway.http.request_context import bearer_token
from gateway.keys.lookup_batch import KeyLookups
from gateway.keys.store import KeyIdentity
from gateway.services import Services
from gateway.tracing import describe_auth, stage

_IDENTITY_KEY = "bastion_identity"
_LOOKUPS_KEY = "key_lookups"

CHAT_ROLES = frozenset({"user", "admin"})
AUDIT_ROLES = frozenset({"auditor"})
ADMIN_ROLES = frozenset({"admin"})


def services_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Services:
    """The loaded services, or a 503 while they are still loading."""
    services: Services | None = connection.app.state.get("services")
    if services is None:
        raise ApiError(
            503,
            "Bastion is still loading its models; retry shortly.",
            type="server_error",
            code="not_ready",
            headers={"retry-after": "5"},
        )
    return services


def require_roles(roles: frozenset[str], *, audit_denials: bool = True) -> Guard:
    """A guard that lets keys of `roles` through; 401 without a valid key, 403 for a
    role that may not call. Each denial is audited (`auth.denied`) unless the route audits
    every request itself (`audit_denials=False`)."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        services = services_of(connection)
        with stage("auth") as span:
            identity, error = await _authenticate(connection, services, roles)
            describe_auth(span, identity, error)
        if error is None:
            connection.state[_IDENTITY_KEY] = identity
            return
        if audit_denials:
            await _audit_denial(connection, services, identity, error)
        raise error

    return guard


async def _authenticate(
    connection: ASGIConnection[Any, Any, Any, Any], services: Services, roles: frozenset[str]
) -> tuple[KeyIdentity | None, ApiError | None]:
    token = bearer_token(connection.headers)
    if token is None:
        return None, unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
        )
    identity = await _key_lookups(connection, services).authenticate(token)
    if identity is None:
        return None, unauthorized(f"Incorrect API key provided: {token[:6]}****.")
    if identity.role not in roles:
        return identity, ApiError(
            403,
            f"A key with role '{identity.role}' may not call this endpoint "
            f"(allowed: {', '.join(sorted(roles))}).",
            type="permission_error",
            code="insufficient_role",
        )
    return identity, None


def _key_lookups(connection: ASGIConnection[Any, Any, Any, Any], services: Services) -> KeyLookups:
    """The app's batched key lookups over the services' database on this event loop, made
    on first use."""
    state, loop = connection.app.state, asyncio.get_running_loop()
    lookups: KeyLookups | None = state.get(_LOOKUPS_KEY)
    if lookups is None or lookups.sessions is not services.sessions or lookups.loop is not loop:
        # A read of a local SQLite file waits on no network: it runs on the event loop.
        off_loop = not is_sqlite(services.sessions)
        lookups = KeyLookups(services.sessions, loop, off_loop=off_loop)
        state[_LOOKUPS_KEY] = lookups
    return lookups


async def _audit_denial(
    connection: ASGIConnection[Any, Any, Any, Any],
    services: Services,
    identity: KeyIdentity | None,
    error: ApiError,
) -> None:
    entry = refusal_entry(connection.scope, "auth.denied", "denied", error, identity)
    await services.audit.record_async(entry)


def _provide_services(request: Request[Any, Any, Any]) -> Services:
    return services_of(request)


def identity_of(connection: ASGIConnection[Any, Any, Any, Any]) -> KeyIdentity:
    """The identity the role guard established for this request."""
    identity: KeyIdentity | None = connection.state.get(_IDENTITY_KEY)
    if identity is None:
        raise RuntimeError(f"{connection.url.path} needs an identity but has no role guard")
    return identity


# What handlers take: `services: ServicesDep, identity: IdentityDep`.
ServicesDep: TypeAlias = Annotated[Services, Dependency(kind="named")]
IdentityDep: TypeAlias = Annotated[KeyIdentity, Dependency(kind="named")]


def _provide_identity(request: Request[Any, Any, Any], services: ServicesDep) -> KeyIdentity:
    """`services` is unused but declared: Litestar resolves independent dependencies in
    a task group of their own, which costs a trip through the event loop's queue behind
    every other request's work (7 ms at the median with 32 at once); one after the other
    they resolve inline."""
    del services
    return identity_of(request)


DEPENDENCIES = {
    "services": Provide(_provide_services, sync_to_thread=False),
    "identity": Provide(_provide_identity, sync_to_thread=False),
}
