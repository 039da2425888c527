"""Writing the audit log: exactly one record per request, whatever its outcome."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import AuditChain
from gateway.audit.subject_keys import SubjectKeys
from gateway.db.models import AuditRecord
from guardrails.verdict import Verdict

log = structlog.get_logger(__name__)


@dataclass
class AuditEntry:
    """What one request did; filled in as the request moves through the stages."""

    request_id: str
    endpoint: str
    event: str = "chat.completion"
    tenant: str | None = None
    key_id: str | None = None
    end_user: str | None = None
    policy_version: str | None = None
    model: str | None = None
    # The upstream server that answered (a base URL); None for the embedded engine.
    upstream: str | None = None
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
    store_content: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        """Whose text this is, for erasure: the end user the client named, else the key."""
        return self.end_user or self.key_id or "anonymous"

    def to_row(self, seal: Callable[[str], str] | None = None) -> AuditRecord:
        """The row to append: text only when the policy allows it (sealed by `seal` when
        given), hashes of the plain text always."""
        keep = self.store_content
        values: dict[str, Any] = {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if name
            not in (
                "verdicts",
                "store_content",
                "prompt_text",
                "answer_text",
                "upstream",
                "details",
            )
        }
        return AuditRecord(
            **values
            | {
                "latency_ms": round(self.latency_ms, 3),
                "engine_ms": round(self.engine_ms, 3),
                "verdicts": [v.to_dict() for v in self.verdicts],
                # In `details`, which the hash chain covers: no new column, so the records
                # written before it verify as they did.
                "details": self.details | ({"upstream": self.upstream} if self.upstream else {}),
                "prompt_sha256": _sha256(self.prompt_text),
                "answer_sha256": _sha256(self.answer_text),
                "prompt_text": _kept(self.prompt_text, keep, seal),
                "answer_text": _kept(self.answer_text, keep, seal),
            }
        )


def _kept(text: str | None, keep: bool, seal: Callable[[str], str] | None) -> str | None:
    if text is None or not keep:
        return None
    return text if seal is None else seal(text)


def _sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


class AuditLog:
    """Appends records, their text sealed with the subject's key; a failure to write is
    logged loudly, never hidden."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._chain = AuditChain(sessions)
        self._keys = SubjectKeys(sessions)

    def record(self, entry: AuditEntry) -> AuditRecord:
        try:
            sealer = self._keys.sealer(entry.tenant, entry.subject)
            return self._chain.append(entry.to_row(sealer))
        except Exception:
            log.exception("audit.write_failed", request_id=entry.request_id)
            raise
