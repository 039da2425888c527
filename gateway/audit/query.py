"""Reading the audit log for reviewers: filters, cursor pages, streamed exports; text is
decrypted with its subject's key, or shown as `[erased]`."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import canonical_value
from gateway.audit.subject_keys import TextOpener
from gateway.db.models import AuditRecord

EXPORT_COLUMNS = [c.name for c in AuditRecord.__table__.columns]
_TEXT_COLUMNS = ("prompt_text", "answer_text")


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """What a reviewer asks for; every field is optional and they combine with AND."""

    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    key_id: str | None = None
    end_user: str | None = None
    outcome: str | None = None
    event: str | None = None
    policy_version: str | None = None
    check: str | None = None
    verdict: str | None = None

    def statement(self, after_seq: int = 0) -> Select[AuditRecord]:
        query = select(AuditRecord).where(AuditRecord.seq > after_seq)
        for column, value in (
            (AuditRecord.tenant, self.tenant),
            (AuditRecord.key_id, self.key_id),
            (AuditRecord.end_user, self.end_user),
            (AuditRecord.outcome, self.outcome),
            (AuditRecord.event, self.event),
            (AuditRecord.policy_version, self.policy_version),
        ):
            if value is not None:
                query = query.where(column == value)
        if self.since is not None:
            query = query.where(AuditRecord.created_at >= self.since)
        if self.until is not None:
            query = query.where(AuditRecord.created_at < self.until)
        return query.order_by(AuditRecord.seq)

    def matches_verdicts(self, record: AuditRecord) -> bool:
        """`check` and `verdict` look inside the JSON list of verdicts."""
        if self.check is None and self.verdict is None:
            return True
        return any(
            (self.check is None or v.get("check") == self.check)
            and (self.verdict is None or v.get("action") == self.verdict)
            for v in record.verdicts
        )


def record_to_dict(record: AuditRecord, opener: TextOpener | None = None) -> dict[str, Any]:
    """A record as reviewers see it: with an opener, its text decrypted (or `[erased]`)."""
    data = {name: canonical_value(getattr(record, name)) for name in EXPORT_COLUMNS}
    if opener is not None:
        for name in _TEXT_COLUMNS:
            data[name] = opener.open(data[name])
    return data


def read_records(
    sessions: sessionmaker[Session], audit_filter: AuditFilter, after_seq: int = 0
) -> Iterator[dict[str, Any]]:
    """Matching records in chain order, readable, in batches (never all in memory)."""
    with sessions() as session:
        opener = TextOpener(session)
        rows = session.scalars(audit_filter.statement(after_seq).execution_options(yield_per=500))
        for record in rows:
            if audit_filter.matches_verdicts(record):
                yield record_to_dict(record, opener)


def read_record(
    sessions: sessionmaker[Session], seq: int, tenant: str | None
) -> dict[str, Any] | None:
    """One record of `tenant`, readable, or None."""
    if not 0 < seq < 2**63:  # beyond a BIGINT no record can match, and drivers refuse it
        return None
    with sessions() as session:
        record = session.scalars(select(AuditRecord).where(AuditRecord.seq == seq)).one_or_none()
        if record is None or record.tenant != tenant:
            return None
        return record_to_dict(record, TextOpener(session))


def page(
    sessions: sessionmaker[Session], audit_filter: AuditFilter, after_seq: int, limit: int
) -> tuple[list[dict[str, Any]], int | None]:
    """One page and the cursor of the next (None at the end)."""
    items: list[dict[str, Any]] = []
    for data in read_records(sessions, audit_filter, after_seq):
        if len(items) == limit:
            return items, int(items[-1]["seq"])
        items.append(data)
    return items, None


def export_lines(
    sessions: sessionmaker[Session], audit_filter: AuditFilter, fmt: Literal["jsonl", "csv"]
) -> Iterator[str]:
    """The export, as text pieces to stream: JSON Lines or CSV with a header row."""
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=EXPORT_COLUMNS)
        writer.writeheader()
        yield _drain(buffer)
    for data in read_records(sessions, audit_filter):
        if fmt == "jsonl":
            yield json.dumps(data, ensure_ascii=False) + "\n"
        else:
            writer.writerow(
                {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in data.items()}
            )
            yield _drain(buffer)


def _drain(buffer: io.StringIO) -> str:
    value = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return value
