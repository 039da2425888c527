"""Guards run as one: Litestar copies the route handler for every guard it calls (about
10 µs a copy, each request), so a route's guards are handed to it as a single guard."""

from __future__ import annotations

import inspect
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard

from gateway.http.auth import CHAT_ROLES, require_roles
from gateway.http.body import require_json
from gateway.limits.quotas import admit_guard


def in_turn(*guards: Guard) -> Guard:
    """One guard that calls `guards` (each sync or async) in order; the first that refuses
    ends the request."""

    async def guard(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        for each in guards:
            outcome = each(connection, handler)
            if inspect.isawaitable(outcome):
                await outcome

    return guard


# The model routes (chat, completions, embeddings): a chat key, admitted under its
# policy's rate limits, sending JSON. Each request is audited by the route itself.
MODEL_CALL_GUARD = in_turn(
    require_roles(CHAT_ROLES, audit_denials=False), admit_guard, require_json
)
