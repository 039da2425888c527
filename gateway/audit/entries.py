"""One constructor for the audit entries of admin actions, whoever takes them.

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

from gateway.audit.log import AuditEntry

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
