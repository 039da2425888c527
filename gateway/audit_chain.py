"""The audit log's hash chain: appending one link, verifying the whole, checkpoints.

Each record stores `seq` (1, 2, 3... with no gaps), the hash of its predecessor and its
own hash: SHA-256 over a domain tag, the predecessor's hash and a canonical JSON encoding
of every other column. Editing, deleting, inserting or reordering a record breaks the
chain where it happened; a checkpoint kept elsewhere also catches a truncated tail.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gateway.models import AuditRecord, utc_now

GENESIS_HASH = "0" * 64
_DOMAIN = b"bastion.audit.v1\x00"
_UNHASHED = frozenset({"id", "record_hash"})
_APPEND_ATTEMPTS = 100


class AuditWriteError(RuntimeError):
    """The record could not be appended; the request it describes must not succeed."""


def canonical_value(value: Any) -> Any:
    """A column value as it is hashed and exported (datetimes as UTC ISO strings)."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).isoformat(timespec="microseconds")
    return value


def record_hash(record: AuditRecord) -> str:
    """The hash a record must carry, computed from its columns and `prev_hash`."""
    fields = {
        column.name: canonical_value(getattr(record, column.key))
        for column in AuditRecord.__table__.columns
        if column.name not in _UNHASHED
    }
    encoded = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(_DOMAIN + encoded.encode()).hexdigest()


class AuditChain:
    """Appends records so that every writer, in any process, extends one linear chain.

    The next `seq` is unique in the database: two writers that race for it collide, and
    the loser retries on top of the winner. PostgreSQL writers first take an advisory
    lock so they queue instead of colliding.
    """

    _ADVISORY_LOCK = 0x6261_7374  # "bast"

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._local = threading.Lock()

    def append(self, record: AuditRecord) -> AuditRecord:
        last_error: Exception | None = None
        with self._local:
            for attempt in range(_APPEND_ATTEMPTS):
                try:
                    return self._append_once(record)
                except (IntegrityError, OperationalError) as exc:
                    last_error = exc
                    time.sleep(min(0.002 * (attempt + 1), 0.05))
        raise AuditWriteError(f"could not append the audit record: {last_error}")

    def _append_once(self, record: AuditRecord) -> AuditRecord:
        with self._sessions.begin() as session:
            if session.get_bind().dialect.name == "postgresql":
                session.execute(text(f"SELECT pg_advisory_xact_lock({self._ADVISORY_LOCK})"))
            last = session.execute(
                select(AuditRecord.seq, AuditRecord.record_hash)
                .order_by(AuditRecord.seq.desc())
                .limit(1)
            ).first()
            row = _copy(record)
            row.seq = last.seq + 1 if last else 1
            row.prev_hash = last.record_hash if last else GENESIS_HASH
            row.created_at = row.created_at or utc_now()
            row.record_hash = record_hash(row)
            session.add(row)
        return row


def _copy(record: AuditRecord) -> AuditRecord:
    values = {
        column.key: getattr(record, column.key)
        for column in AuditRecord.__table__.columns
        if column.key not in ("id",)
    }
    return AuditRecord(**values)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The head of the chain at one moment: keep it outside the database."""

    seq: int
    head_hash: str
    created_at: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, data: str) -> Checkpoint:
        raw = json.loads(data)
        return cls(
            seq=int(raw["seq"]), head_hash=str(raw["head_hash"]), created_at=str(raw["created_at"])
        )


def make_checkpoint(sessions: sessionmaker[Session]) -> Checkpoint:
    with sessions() as session:
        last = session.execute(
            select(AuditRecord.seq, AuditRecord.record_hash)
            .order_by(AuditRecord.seq.desc())
            .limit(1)
        ).first()
    seq, head = (last.seq, last.record_hash) if last else (0, GENESIS_HASH)
    return Checkpoint(seq, head, utc_now().isoformat())


@dataclass
class VerifyReport:
    """What `verify_chain` found; `ok` only when no problem was found."""

    records: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _rows(sessions: sessionmaker[Session]) -> Iterator[AuditRecord]:
    with sessions() as session:
        yield from session.scalars(
            select(AuditRecord).order_by(AuditRecord.seq).execution_options(yield_per=500)
        )


def verify_chain(
    sessions: sessionmaker[Session], checkpoint: Checkpoint | None = None, max_problems: int = 20
) -> VerifyReport:
    """Walk the chain in `seq` order and report every break, naming the record."""
    report = VerifyReport()
    expected_seq, expected_prev = 1, GENESIS_HASH
    checkpoint_seen = checkpoint is None or checkpoint.seq == 0
    for row in _rows(sessions):
        report.records += 1
        if row.seq != expected_seq:
            report.problems.append(
                f"records {expected_seq}..{row.seq - 1} are missing (deleted)"
                if row.seq > expected_seq
                else f"record {row.seq} appears out of order"
            )
        elif row.prev_hash != expected_prev:
            report.problems.append(
                f"record {row.seq} does not follow record {row.seq - 1} "
                "(a record was inserted, removed or reordered)"
            )
        if record_hash(row) != row.record_hash:
            report.problems.append(f"record {row.seq} was modified after it was written")
        if checkpoint is not None and row.seq == checkpoint.seq:
            checkpoint_seen = True
            if row.record_hash != checkpoint.head_hash:
                report.problems.append(
                    f"record {row.seq} differs from the checkpoint of {checkpoint.created_at}"
                )
        expected_seq, expected_prev = row.seq + 1, row.record_hash
        report.head_seq, report.head_hash = row.seq, row.record_hash
        if len(report.problems) >= max_problems:
            break
    if not checkpoint_seen and checkpoint is not None:
        report.problems.append(
            f"the chain ends at record {report.head_seq}, before the checkpoint's record "
            f"{checkpoint.seq} (records were truncated)"
        )
    return report


def count_records(sessions: sessionmaker[Session]) -> int:
    with sessions() as session:
        return int(session.scalar(select(func.count()).select_from(AuditRecord)) or 0)
