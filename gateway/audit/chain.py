"""The audit log's hash chain: appending one link, verifying the whole, checkpoints.

Each record stores `seq` (1, 2, 3... with no gaps), the hash of its predecessor and its
own hash: SHA-256 over a domain tag, the predecessor's hash and a canonical JSON encoding
of every other column. Editing, deleting, inserting or reordering a record breaks the
chain where it happened; a checkpoint kept elsewhere also catches a truncated tail. A
retention purge (`gateway.audit.retention`) may remove a prefix of the chain, and the
`audit.purged` record it appends vouches for the new first record.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, insert, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.connection import loop_twin
from gateway.db.models import AuditRecord, utc_now

GENESIS_HASH = "0" * 64
_DOMAIN = b"bastion.audit.v1\x00"
_UNHASHED = frozenset({"id", "record_hash"})
_AUDIT_TABLE = cast(Table, AuditRecord.__table__)
_HASHED_COLUMNS = tuple(c for c in _AUDIT_TABLE.columns if c.name not in _UNHASHED)
# Built once: the writer runs them for every batch, on the thread that shares the GIL with
# the event loop, and building them (or going through the ORM session) cost more than
# running them.
_HEAD = select(AuditRecord.seq, AuditRecord.record_hash).order_by(AuditRecord.seq.desc()).limit(1)
_INSERT = insert(_AUDIT_TABLE)
_CHAIN_LOCK = text("SELECT pg_advisory_xact_lock(:lock)")
_APPEND_ATTEMPTS = 100
_PG_CONFLICT_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
_PG_UNIQUE_VIOLATION = "23505"
_CHECKPOINT_DOMAIN = "bastion.audit.checkpoint.v1"
PURGE_EVENT = "audit.purged"


class AuditWriteError(RuntimeError):
    """The record could not be appended; the request it describes must not succeed."""


# A record to append: a value for every column but `id` and those the chain fills in as
# it links the record (`seq`, `prev_hash`, `created_at`, `record_hash`).
# Plain values rather than an `AuditRecord`: the ORM's instrumented object cost a third
# of the writer's time, on the thread that shares the GIL with the event loop.
RecordValues = Mapping[str, Any]
# Builds a batch's records inside the transaction that links them, reading there what they
# need (the subjects' keys); called again when the transaction is retried.
RecordsBuilder = Callable[[Connection], Sequence[RecordValues]]


@dataclass(frozen=True, slots=True)
class AppendedRecord:
    """A record once committed: where it sits in the chain, and what its caller needs."""

    seq: int
    prev_hash: str
    record_hash: str
    request_id: str
    event: str
    details: dict[str, Any]

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> AppendedRecord:
        return cls(
            seq=row["seq"],
            prev_hash=row["prev_hash"],
            record_hash=row["record_hash"],
            request_id=row["request_id"],
            event=row["event"],
            details=row["details"],
        )


def canonical_value(value: Any) -> Any:
    """A column value as it is hashed and exported (datetimes as UTC ISO strings)."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).isoformat(timespec="microseconds")
    return value


def record_hash(record: AuditRecord) -> str:
    """The hash a record must carry, computed from its columns and `prev_hash`."""
    return _hash_of({column.key: getattr(record, column.key) for column in _HASHED_COLUMNS})


def _hash_of(values: dict[str, Any]) -> str:
    fields = {column.name: canonical_value(values[column.key]) for column in _HASHED_COLUMNS}
    encoded = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(_DOMAIN + encoded.encode()).hexdigest()


class AuditChain:
    """Appends records so that every writer, in any process, extends one linear chain.

    The next `seq` is unique in the database: two writers that race for it collide, and
    the loser retries on top of the winner. PostgreSQL writers first take an advisory
    lock so they queue instead of colliding, and read the head under it. A SQLite writer
    links onto the head it wrote last, without reading it again: the chain has no gaps,
    so if anyone appended since, the first `seq` it takes is taken and it retries from
    the head it then reads (each statement on the writer thread waits for the event
    loop to hand back the GIL, about a millisecond under load).
    """

    _ADVISORY_LOCK = 0x6261_7374  # "bast"

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._engine: Engine = sessions.kw["bind"]
        self._loop_engine = loop_twin(self._engine)
        self._local = threading.Lock()
        self._reads_head = self._engine.dialect.name != "sqlite"
        self._last_written: tuple[int, str] | None = None

    def append_many(self, build: RecordsBuilder) -> list[AppendedRecord]:
        """Link the records `build` makes, in order, in one transaction: contiguous `seq`s,
        one commit. A conflict with another writer retries them all on top of the winner."""
        with self._local:
            for attempt in range(_APPEND_ATTEMPTS):
                appended = self._attempt(build, self._engine)
                if appended is not None:
                    return appended
                time.sleep(min(0.002 * (attempt + 1), 0.05))
        raise AuditWriteError(
            "could not append the audit record: other writers kept taking the chain's head "
            f"({_APPEND_ATTEMPTS} attempts)"
        )

    @property
    def appends_without_waiting(self) -> bool:
        """Whether `try_append_now` may be called: a local SQLite file, no fsync a commit."""
        return self._loop_engine is not None

    def try_append_now(self, build: RecordsBuilder) -> list[AppendedRecord] | None:
        """`append_many` for the event loop, which must wait for nothing: None, with nothing
        written, when the chain's lock or the database file is taken, or another writer
        moved the head (the caller hands the batch to `append_many`, which waits)."""
        if self._loop_engine is None:
            raise RuntimeError("this database is not written on the event loop")
        if not self._local.acquire(blocking=False):
            return None
        try:
            return self._attempt(build, self._loop_engine)
        finally:
            self._local.release()

    def checkpoint(self) -> None:
        """Copy what the WAL holds into the database file without waiting for readers or
        writers (on a thread: the engine `try_append_now` uses never checkpoints)."""
        with self._engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def _attempt(self, build: RecordsBuilder, engine: Engine) -> list[AppendedRecord] | None:
        """One transaction through `engine`, under `_local`: its records, or None when
        another writer got there first (nothing written). Any other failure raises."""
        try:
            with engine.begin() as connection:
                lock_chain(connection)
                records = build(connection)
                if not records:
                    return []
                head = self._last_written
                if head is None or self._reads_head:
                    head = chain_head(connection)
                rows = _insert_linked(connection, records, head)
        except (IntegrityError, OperationalError) as exc:
            self._last_written = None
            if is_write_conflict(exc):
                return None
            raise AuditWriteError(f"could not append the audit record: {exc}") from exc
        self._last_written = (rows[-1]["seq"], rows[-1]["record_hash"])
        return [AppendedRecord.of(row) for row in rows]


def is_write_conflict(exc: IntegrityError | OperationalError) -> bool:
    """Another writer got there first (a taken `seq`, a locked SQLite file, a PostgreSQL
    serialization failure or deadlock): worth retrying. An unreachable database is not,
    nor a constraint or trigger that refuses the rows (they would be refused again)."""
    sqlstate = getattr(exc.orig, "sqlstate", None)
    message = str(exc.orig).lower()
    if isinstance(exc, IntegrityError):
        return sqlstate == _PG_UNIQUE_VIOLATION or "unique constraint failed" in message
    if sqlstate in _PG_CONFLICT_STATES:
        return True
    return "database is locked" in message or "database table is locked" in message


def lock_chain(db: Connection | Session) -> None:
    """Queue behind other PostgreSQL writers of the chain until this transaction ends."""
    dialect = db.dialect if isinstance(db, Connection) else db.get_bind().dialect
    if dialect.name == "postgresql":
        db.execute(_CHAIN_LOCK, {"lock": AuditChain._ADVISORY_LOCK})


def append_in(
    session: Session, record: RecordValues, head: tuple[int, str] | None = None
) -> AppendedRecord:
    """Link `record` to the chain's head (read now, unless the caller passes the
    `(seq, hash)` it read before deleting rows) inside the caller's transaction."""
    rows = _insert_linked(session, [record], chain_head(session) if head is None else head)
    return AppendedRecord.of(rows[0])


def chain_head(db: Connection | Session) -> tuple[int, str]:
    """The last record's `(seq, record_hash)`, or the genesis link of an empty chain."""
    last = db.execute(_HEAD).first()
    return (last.seq, last.record_hash) if last else (0, GENESIS_HASH)


def _insert_linked(
    db: Connection | Session, records: Sequence[RecordValues], head: tuple[int, str]
) -> list[dict[str, Any]]:
    """Insert `records` as the rows that follow `head`, in order; returns their values.
    One executemany through the Core: the ORM's unit of work cost more than the rows' own
    writing, on the thread that shares the GIL with the event loop."""
    rows = []
    for record in records:
        values = linked_values(record, head)
        head = (values["seq"], values["record_hash"])
        rows.append(values)
    db.execute(_INSERT, rows)
    return rows


def linked_values(record: RecordValues, head: tuple[int, str]) -> dict[str, Any]:
    """The column values of `record` as the row that follows `head`, hash included."""
    values = dict(record)
    values["seq"], values["prev_hash"] = head[0] + 1, head[1]
    values["created_at"] = utc_now()
    values["record_hash"] = _hash_of(values)
    return values


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The head of the chain at one moment: keep it outside the database.

    `signature` is an HMAC-SHA256 over the other fields; with it, a checkpoint found later
    (next to a backup, in a ticket) proves it was made by whoever holds the signing key.
    """

    seq: int
    head_hash: str
    created_at: str
    signature: str | None = None

    def _message(self) -> bytes:
        return (
            f"{_CHECKPOINT_DOMAIN}\x00{self.seq}\x00{self.head_hash}\x00{self.created_at}".encode()
        )

    def signed(self, key: bytes) -> Checkpoint:
        digest = hmac.new(key, self._message(), hashlib.sha256).hexdigest()
        return replace(self, signature=digest)

    def signature_valid(self, key: bytes) -> bool:
        expected = hmac.new(key, self._message(), hashlib.sha256).hexdigest()
        return self.signature is not None and hmac.compare_digest(expected, self.signature)

    def to_json(self) -> str:
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(fields, indent=2)

    @classmethod
    def from_json(cls, data: str) -> Checkpoint:
        raw = json.loads(data)
        signature = raw.get("signature")
        return cls(
            seq=int(raw["seq"]),
            head_hash=str(raw["head_hash"]),
            created_at=str(raw["created_at"]),
            signature=None if signature is None else str(signature),
        )


def make_checkpoint(sessions: sessionmaker[Session], key: bytes | None = None) -> Checkpoint:
    """The current head; signed when a key is given."""
    with sessions() as session:
        seq, head = chain_head(session)
    checkpoint = Checkpoint(seq, head, utc_now().isoformat())
    return checkpoint if key is None else checkpoint.signed(key)


@dataclass
class VerifyReport:
    """What `verify_chain` found; `ok` only when no problem was found."""

    records: int = 0
    first_seq: int = 0
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


def vouches_for(row: AuditRecord, first_seq: int, first_prev_hash: str) -> bool:
    """Whether `row` is a retention purge that removed exactly the records before
    `first_seq`, the last of which hashed to `first_prev_hash`."""
    if row.event != PURGE_EVENT or not isinstance(row.details, dict):
        return False
    return (
        row.details.get("purged_through") == first_seq - 1
        and row.details.get("last_purged_hash") == first_prev_hash
    )


def verify_chain(
    sessions: sessionmaker[Session],
    checkpoint: Checkpoint | None = None,
    max_problems: int = 20,
    checkpoint_key: bytes | None = None,
) -> VerifyReport:
    """Walk the chain in `seq` order and report every break, naming the record.

    A chain may start after record 1 only when one of its own `audit.purged` records
    names the purged range and the hash of the last purged record.
    """
    report = VerifyReport()
    if (
        checkpoint is not None
        and checkpoint.signature is not None
        and checkpoint_key is not None
        and not checkpoint.signature_valid(checkpoint_key)
    ):
        report.problems.append(
            "the checkpoint's signature does not match (forged, edited or signed with another key)"
        )
    expected_seq, expected_prev = 1, GENESIS_HASH
    checkpoint_seen = checkpoint is None or checkpoint.seq == 0
    head_gap: tuple[int, str] | None = None  # (first seq, its prev_hash) when seq 1 is gone
    for row in _rows(sessions):
        report.records += 1
        if report.records == 1:
            report.first_seq = row.seq
            if row.seq > 1:
                head_gap = (row.seq, row.prev_hash)
                expected_seq, expected_prev = row.seq, row.prev_hash
                if checkpoint is not None and checkpoint.seq < row.seq:
                    checkpoint_seen = True  # purged or deleted: the head gap is judged below
                    if checkpoint.seq == row.seq - 1 and checkpoint.head_hash != row.prev_hash:
                        report.problems.append(
                            f"record {row.seq} does not follow the checkpoint of "
                            f"{checkpoint.created_at}"
                        )
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
        if head_gap is not None and vouches_for(row, *head_gap):
            head_gap = None
        if checkpoint is not None and row.seq == checkpoint.seq:
            checkpoint_seen = True
            if row.record_hash != checkpoint.head_hash:
                report.problems.append(
                    f"record {row.seq} differs from the checkpoint of {checkpoint.created_at}"
                )
        expected_seq, expected_prev = row.seq + 1, row.record_hash
        report.head_seq, report.head_hash = row.seq, row.record_hash
        if len(report.problems) >= max_problems:
            return report
    if head_gap is not None:
        report.problems.append(
            f"records 1..{head_gap[0] - 1} are missing (deleted; no {PURGE_EVENT} record "
            "vouches for them)"
        )
    if not checkpoint_seen and checkpoint is not None:
        report.problems.append(
            f"the chain ends at record {report.head_seq}, before the checkpoint's record "
            f"{checkpoint.seq} (records were truncated)"
        )
    return report
