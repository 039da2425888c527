"""The constructors of audit entries that are not a chat request: admin actions, whoever
takes them, and requests refused before a route ran.

The conventions, the same over HTTP, from the CLI and from the policy watcher:
- `request_id`: the HTTP request's own id (its `x-request-id`), so the action's record
  joins the request; `act_<hex>` for an action that is not an HTTP request.
- `details.actor`: `key:<key id>` over HTTP, `cli:<user>` from the CLI, `startup` or
  `watcher` for policy loads; a key's id, never its secret.
- `endpoint`: the route's path over HTTP, `cli` from the CLI, `policy-watcher`.
- `status_code`: the HTTP status answered; 0 when the action was not an HTTP request.
"""

from __future__ import annotations

import getpass
import uuid
from typing import Any

from litestar.types import Scope

from gateway.audit.log import AuditEntry
from gateway.http.errors import ApiError
from gateway.http.request_context import request_id_of
from gateway.keys.store import KeyIdentity

CLI_ENDPOINT = "cli"


def admin_action_entry(
    *,
    event: str,
    actor: str,
    endpoint: str,
    tenant: str | None = None,
    key_id: str | None = None,
    outcome: str = "ok",
    status_code: int = 0,
    request_id: str | None = None,
    policy_version: str | None = None,
    details: dict[str, Any] | None = None,
) -> AuditEntry:
    """The record of one admin action; `request_id` None: the action is no HTTP request."""
    return AuditEntry(
        request_id=request_id or f"act_{uuid.uuid4().hex}",
        endpoint=endpoint,
        event=event,
        tenant=tenant,
        key_id=key_id,
        policy_version=policy_version,
        outcome=outcome,
        status_code=status_code,
        details={"actor": actor, **(details or {})},
    )


def key_actor(key_id: str) -> str:
    return f"key:{key_id}"


def cli_actor() -> str:
    return f"cli:{getpass.getuser()}"


def refusal_entry(
    scope: Scope,
    event: str,
    outcome: str,
    error: ApiError,
    identity: KeyIdentity | None = None,
) -> AuditEntry:
    """The record of a request refused before any route ran it (a denied key, oversized
    headers): under the request's id, naming the method and path."""
    return AuditEntry(
        request_id=request_id_of(scope),
        endpoint=f"{scope.get('method', '')} {scope['path']}",
        event=event,
        tenant=identity.tenant if identity else None,
        key_id=identity.key_id if identity else None,
        outcome=outcome,
        status_code=error.status,
        error_code=error.code,
    )
