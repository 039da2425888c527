"""`POST /v1/guardrails/check`: the caller's policy checks on a text, nothing generated."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request, Router, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import JSONBody

from gateway.audit.request_audit import audit_every_request, caller_audit
from gateway.guardrails_check.schemas import GuardrailsCheckRequest, GuardrailsCheckResponse
from gateway.guardrails_check.service import CHECK_EVENT, run_check
from gateway.http.auth import (
    CHAT_ROLES,
    IdentityDep,
    ServicesDep,
    identity_of,
    require_roles,
    services_of,
)
from gateway.http.body import require_json
from gateway.http.errors import ApiError
from gateway.http.openapi_docs import BEARER_SECURITY, errors
from gateway.limits.quotas import admit_guard
from gateway.policy.runtime import policy_for

GUARDRAILS_CHECK_PATH = "/v1/guardrails/check"


async def policy_allows_caller(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard, after the role guard and before the body is read: admins may always call;
    `user` keys only where their policy's `guardrails_check.allow_user` is set."""
    identity = identity_of(connection)
    if identity.role == "admin":
        return
    runtime = policy_for(services_of(connection).policies, identity)
    if not runtime.loaded.policy.guardrails_check.allow_user:
        raise ApiError(
            403,
            "Your policy does not let user keys call the check endpoint "
            "(set guardrails_check.allow_user in the policy).",
            type="permission_error",
            code="not_allowed_by_policy",
        )


@post(
    "/guardrails/check",
    status_code=200,
    # Every request is audited once by the middleware, denials included.
    guards=[
        require_roles(CHAT_ROLES, audit_denials=False),
        policy_allows_caller,
        admit_guard,
        require_json,
    ],
    middleware=[audit_every_request(GUARDRAILS_CHECK_PATH, event=CHECK_EVENT)],
    responses=errors(400, 404, 413, 415, 429),
)
async def check_guardrails(
    request: Request[Any, Any, Any],
    data: JSONBody[GuardrailsCheckRequest],
    services: ServicesDep,
    identity: IdentityDep,
) -> GuardrailsCheckResponse:
    """Run the checks the caller's policy gives a chat prompt (or answer) on a text, with
    the same thresholds and modes, and report each verdict; `admin` keys, and `user` keys
    where the policy's `guardrails_check.allow_user` is set."""
    entry = caller_audit(request.scope, identity).entry
    runtime = policy_for(services.policies, identity)
    entry.policy_version = runtime.loaded.version
    outcome = await asyncio.to_thread(run_check, runtime, data)
    entry.verdicts.extend(outcome.audited)
    entry.outcome = "ok"
    entry.details.update(direction=data.direction, decision=outcome.response.decision)
    return outcome.response


GUARDRAILS_CHECK_ROUTER = Router(
    path="/v1",
    route_handlers=[check_guardrails],
    security=BEARER_SECURITY,
    tags=["guardrails"],
)
