"""Routes whose every request leaves exactly one audit record, whatever its outcome: a
refused key, a body that does not validate, a guardrail's block, an answer.

A route middleware opens the entry before the guards run; the handler fills it in; the
exception handlers note the error they answer with; the record is written just before the
response starts, so a client that has the answer finds its record. A streamed answer
records the entry itself, before its closing events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from litestar import Litestar
from litestar.types import ASGIApp, HTTPResponseStartEvent, Message, Receive, Scope, Send
from sqlalchemy.exc import OperationalError

from gateway.audit.chain import AuditWriteError
from gateway.audit.log import AuditEntry, AuditLog
from gateway.http.errors import ApiError, database_unavailable
from gateway.http.metrics import GatewayMetrics
from gateway.http.request_context import request_id_of
from gateway.keys.store import KeyIdentity
from gateway.tracing import describe_entry, stage

log = structlog.get_logger(__name__)
_STATE_KEY = "bastion_request_audit"


@dataclass
class RequestAudit:
    """The entry of one request, and who writes it."""

    entry: AuditEntry
    started: float
    streamed: bool = False  # the answer's stream records the entry itself

    async def write(self, audit: AuditLog, metrics: GatewayMetrics) -> None:
        """Write the entry with its latency, and count it in the metrics."""
        self.entry.latency_ms = (time.perf_counter() - self.started) * 1000
        describe_entry(self.entry)
        with stage("audit.write"):
            await audit.record_async(self.entry)
        metrics.observe(self.entry)


def request_audit_of(scope: Scope) -> RequestAudit | None:
    found: RequestAudit | None = scope.get("state", {}).get(_STATE_KEY)
    return found


def caller_audit(scope: Scope, identity: KeyIdentity) -> RequestAudit:
    """The request's pending audit, its entry naming the authenticated caller; for a
    handler on a route with `audit_every_request`."""
    pending = request_audit_of(scope)
    if pending is None:
        raise RuntimeError(f"{scope['path']} runs without its audit middleware")
    pending.entry.tenant, pending.entry.key_id = identity.tenant, identity.key_id
    return pending


def note_error(scope: Scope, error: ApiError) -> None:
    """The error a request is answered with, on its entry (a guardrail's block stays one)."""
    pending = request_audit_of(scope)
    if pending is None:
        return
    entry = pending.entry
    entry.status_code, entry.error_code = error.status, error.code
    if entry.outcome != "blocked":
        entry.outcome = "rejected" if error.status < 500 else "error"


def audit_every_request(
    endpoint: str, event: str = "chat.completion"
) -> Callable[[ASGIApp], ASGIApp]:
    """Route middleware: one audit record, of `event`, for every request to `endpoint`.

    When the record cannot be written, the answer is withheld and the client gets the
    database's 503 instead: nothing is answered that could not be audited.
    """

    def middleware(app: ASGIApp) -> ASGIApp:
        async def audited(scope: Scope, receive: Receive, send: Send) -> None:
            if Litestar.from_scope(scope).state.get("services") is None:
                # Still loading: the guard answers 503 and there is no log to write to.
                await app(scope, receive, send)
                return
            pending = RequestAudit(
                AuditEntry(request_id=request_id_of(scope), endpoint=endpoint, event=event),
                started=time.perf_counter(),
            )
            scope["state"][_STATE_KEY] = pending
            recorded = withheld = False

            async def send_after_recording(message: Message) -> None:
                nonlocal recorded, withheld
                if withheld:
                    return
                if message["type"] == "http.response.start" and not recorded:
                    recorded = True
                    if not pending.streamed:
                        pending.entry.status_code = message["status"]
                        try:
                            state = Litestar.from_scope(scope).state
                            await pending.write(state.services.audit, state.metrics)
                        except (OperationalError, AuditWriteError):
                            log.exception("audit.request_unrecorded")
                            withheld = True
                            await _send_error(send, database_unavailable())
                            return
                await send(message)

            await app(scope, receive, send_after_recording)

        return audited

    return middleware


async def _send_error(send: Send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers += [(name.encode(), value.encode()) for name, value in error.headers.items()]
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": error.status,
        "headers": headers,
    }
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
