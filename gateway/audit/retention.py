"""Removing data from the audit log under policy, without breaking its proof of integrity.

Retention purge: delete the oldest records (a prefix of the chain) in one transaction that
switches the append-only trigger off, then append an `audit.purged` record that names the
range and the last purged hash, so `verify_chain` accepts the shorter chain. Erasure:
destroy a data subject's key (see `gateway.audit.subject_keys`) and append an `audit.erasure`
record; the sealed text stays, hashed as stored, but nobody can read it any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import (
    PURGE_EVENT,
    AppendedRecord,
    Checkpoint,
    append_in,
    lock_chain,
    verify_chain,
)
from gateway.audit.entries import CLI_ENDPOINT, admin_action_entry
from gateway.audit.subject_keys import ErasedKey, erase_keys_in
from gateway.db.connection import is_sqlite
from gateway.db.models import AuditRecord, utc_now

log = structlog.get_logger(__name__)

ERASURE_EVENT = "audit.erasure"


class AuditRetentionError(RuntimeError):
    """The purge was refused; nothing was deleted."""


@dataclass(frozen=True, slots=True)
class PurgeResult:
    """What a purge removed, the record that vouches for it and the signed new head."""

    purged: int
    first_seq: int
    last_seq: int
    last_hash: str
    record: AppendedRecord
    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class ErasureResult:
    """The keys an erasure destroyed and the records that say so."""

    keys: list[ErasedKey]
    records: list[AppendedRecord]


def purge_before(
    sessions: sessionmaker[Session], cutoff: datetime, signing_key: bytes, actor: str
) -> PurgeResult | None:
    """Delete the records written before `cutoff` from the head of the chain (stopping at
    the first newer one), or None when there are none. Refuses a chain that does not
    verify: purging would destroy the evidence of tampering."""
    report = verify_chain(sessions)
    if not report.ok:
        raise AuditRetentionError(
            "the audit chain does not verify, so nothing was purged: " + report.problems[0]
        )
    cutoff = cutoff.astimezone(UTC) if cutoff.tzinfo else cutoff.replace(tzinfo=UTC)
    with sessions.begin() as session:
        lock_chain(session)
        _allow_deletes(session)  # first: on SQLite, its INSERT takes the write lock
        try:
            first_seq = session.scalar(select(func.min(AuditRecord.seq)))
            head = session.execute(
                select(AuditRecord.seq, AuditRecord.record_hash)
                .order_by(AuditRecord.seq.desc())
                .limit(1)
            ).first()
            newer = session.scalar(
                select(func.min(AuditRecord.seq)).where(AuditRecord.created_at >= cutoff)
            )
            if first_seq is None or head is None or newer == first_seq:
                return None
            last_seq = head.seq if newer is None else newer - 1
            last_hash = session.scalar(
                select(AuditRecord.record_hash).where(AuditRecord.seq == last_seq)
            )
            if last_hash is None:
                raise AuditRetentionError(f"record {last_seq} vanished while purging")
            session.execute(delete(AuditRecord).where(AuditRecord.seq <= last_seq))
        finally:
            _forbid_deletes(session)
        record = append_in(
            session,
            admin_action_entry(
                event=PURGE_EVENT,
                actor=actor,
                endpoint=CLI_ENDPOINT,
                details={
                    "cutoff": cutoff.isoformat(),
                    "purged_from": first_seq,
                    "purged_through": last_seq,
                    "purged_records": last_seq - first_seq + 1,  # the chain verified: no gaps
                    "last_purged_hash": last_hash,
                },
            ).to_row(),
            head=(head.seq, head.record_hash),  # the purge may have emptied the table
        )
    checkpoint = Checkpoint(record.seq, record.record_hash, utc_now().isoformat())
    log.info("audit.purged", first=first_seq, last=last_seq, head=record.seq)
    return PurgeResult(
        purged=last_seq - first_seq + 1,
        first_seq=first_seq,
        last_seq=last_seq,
        last_hash=last_hash,
        record=record,
        checkpoint=checkpoint.signed(signing_key),
    )


def _allow_deletes(session: Session) -> None:
    """Switch the append-only trigger off for DELETE, for this transaction only."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL bastion.audit_purge = 'on'"))
    else:
        session.execute(text("INSERT INTO audit_purge_grants DEFAULT VALUES"))


def _forbid_deletes(session: Session) -> None:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL bastion.audit_purge = 'off'"))
    else:
        session.execute(text("DELETE FROM audit_purge_grants"))


def erase_subject(
    sessions: sessionmaker[Session], subject: str, tenant: str | None, actor: str
) -> ErasureResult:
    """Destroy the subject's keys (in `tenant`, or in every tenant when None) and append
    one `audit.erasure` record per tenant concerned, in one transaction."""
    with sessions.begin() as session:
        if is_sqlite(sessions):
            # Zero the freed bytes instead of leaving the key in the file's free space.
            session.execute(text("PRAGMA secure_delete = ON"))
        lock_chain(session)
        erased = erase_keys_in(session, subject, tenant)
        tenants = sorted({k.tenant for k in erased}) or [tenant or ""]
        records = [
            append_in(
                session,
                admin_action_entry(
                    event=ERASURE_EVENT,
                    actor=actor,
                    endpoint=CLI_ENDPOINT,
                    tenant=name or None,
                    details={
                        "subject": subject,
                        "keys_erased": [k.key_id for k in erased if k.tenant == name],
                    },
                ).to_row(),
            )
            for name in tenants
        ]
    _scrub_key_table(sessions)
    log.info("audit.erased", keys=len(erased), tenants=tenants)
    return ErasureResult(erased, records)


def _scrub_key_table(sessions: sessionmaker[Session]) -> None:
    """Best effort to drop old copies of the erased keys that the database still holds
    (SQLite's write-ahead log, PostgreSQL's dead row versions); backups are out of reach."""
    engine = sessions.kw["bind"]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if engine.dialect.name == "sqlite":
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        elif engine.dialect.name == "postgresql":
            conn.execute(text("VACUUM audit_subject_keys"))
