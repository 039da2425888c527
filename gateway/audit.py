"""Writing the audit log: exactly one record per request, whatever its outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy.orm import Session, sessionmaker

from gateway.models import AuditRecord
from guardrails.verdict import Verdict

log = structlog.get_logger(__name__)


@dataclass
class AuditEntry:
    """What one request did; filled in as the request moves through the stages."""

    request_id: str
    endpoint: str
    tenant: str | None = None
    key_id: str | None = None
    end_user: str | None = None
    policy_version: str | None = None
    model: str | None = None
    outcome: str = "error"
    status_code: int = 500
    error_code: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    chunk_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    engine_ms: float = 0.0
    prompt_text: str | None = None
    answer_text: str | None = None

    def to_row(self) -> AuditRecord:
        values: dict[str, Any] = {
            name: getattr(self, name) for name in self.__dataclass_fields__ if name != "verdicts"
        }
        return AuditRecord(**values, verdicts=[v.to_dict() for v in self.verdicts])


class AuditLog:
    """Appends records; a failure to write is logged loudly, never hidden."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def record(self, entry: AuditEntry) -> None:
        try:
            with self._sessions.begin() as session:
                session.add(entry.to_row())
        except Exception:
            log.exception("audit.write_failed", request_id=entry.request_id)
            raise
