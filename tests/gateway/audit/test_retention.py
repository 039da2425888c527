"""Retention purge: the head of the chain goes, an `audit.purged` record vouches for it,
and the chain still verifies; a head deleted any other way is still reported."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import PURGE_EVENT, Checkpoint, make_checkpoint, verify_chain
from gateway.audit.retention import AuditRetentionError, purge_before
from gateway.audit.signing import KEY_FILE_NAME, load_signing_key
from gateway.db.models import AuditRecord, utc_now
from gateway.settings import Settings
from tests.gateway.audit.test_chain import entry, open_log, tamper

KEY = b"test-signing-key"


def created_at(sessions: sessionmaker[Session], seq: int) -> datetime:
    with sessions() as session:
        found = session.scalar(select(AuditRecord.created_at).where(AuditRecord.seq == seq))
    assert found is not None
    return found


def test_purge_keeps_a_chain_that_verifies(database_url: str) -> None:
    engine, sessions, log = open_log(database_url)
    for n in range(1, 7):
        log.record(entry(n))
    before = make_checkpoint(sessions, KEY)
    old_checkpoint = Checkpoint(2, "0" * 64, before.created_at)  # of a record to be purged

    result = purge_before(sessions, created_at(sessions, 4), KEY, "test")

    assert result is not None
    assert (result.first_seq, result.last_seq, result.purged) == (1, 3, 3)
    assert result.record.event == PURGE_EVENT and result.record.seq == 7
    assert result.record.details["last_purged_hash"] == result.last_hash
    report = verify_chain(sessions)
    assert report.ok, report.problems
    assert (report.first_seq, report.head_seq, report.records) == (4, 7, 4)
    assert verify_chain(sessions, before, checkpoint_key=KEY).ok
    assert verify_chain(sessions, old_checkpoint).ok  # purged past it: nothing to compare
    assert result.checkpoint.signature_valid(KEY)
    assert verify_chain(sessions, result.checkpoint, checkpoint_key=KEY).ok
    forged = verify_chain(sessions, result.checkpoint, checkpoint_key=b"another key")
    assert any("signature" in problem for problem in forged.problems)

    # A second purge removes the first one's record too; its own record vouches instead.
    log.record(entry(8))
    again = purge_before(sessions, utc_now() + timedelta(seconds=1), KEY, "test")
    assert again is not None and (again.first_seq, again.last_seq) == (4, 8)
    report = verify_chain(sessions)
    assert report.ok, report.problems
    assert (report.first_seq, report.records) == (9, 1)
    assert purge_before(sessions, utc_now() - timedelta(days=1), KEY, "test") is None
    engine.dispose()


def test_a_head_deleted_without_a_purge_record_is_reported(database_url: str) -> None:
    engine, sessions, log = open_log(database_url)
    for n in range(1, 7):
        log.record(entry(n))
    assert purge_before(sessions, created_at(sessions, 3), KEY, "test") is not None
    tamper(engine, "DELETE FROM audit_records WHERE seq <= 3")  # one more than was purged
    report = verify_chain(sessions)
    assert not report.ok
    assert any("records 1..3 are missing" in p for p in report.problems), report.problems
    engine.dispose()


def test_a_head_deleted_from_a_fresh_chain_is_reported(sqlite_url: str) -> None:
    engine, sessions, log = open_log(sqlite_url)
    for n in range(1, 5):
        log.record(entry(n))
    tamper(engine, "DELETE FROM audit_records WHERE seq <= 2")
    report = verify_chain(sessions)
    assert any("records 1..2 are missing" in p for p in report.problems), report.problems
    engine.dispose()


def test_a_tampered_chain_is_not_purged(sqlite_url: str) -> None:
    engine, sessions, log = open_log(sqlite_url)
    for n in range(1, 5):
        log.record(entry(n))
    tamper(engine, "UPDATE audit_records SET prompt_tokens = 99 WHERE seq = 2")
    with pytest.raises(AuditRetentionError, match="record 2 was modified"):
        purge_before(sessions, utc_now(), KEY, "test")
    assert verify_chain(sessions).records == 4
    engine.dispose()


def test_the_signing_key_file_is_created_once_for_its_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BASTION_AUDIT_SIGNING_KEY", raising=False)
    key = load_signing_key(tmp_path, Settings().audit_signing_key)
    assert len(key) == 64
    assert stat.S_IMODE(os.stat(tmp_path / KEY_FILE_NAME).st_mode) == 0o600
    assert load_signing_key(tmp_path, Settings().audit_signing_key) == key
    monkeypatch.setenv("BASTION_AUDIT_SIGNING_KEY", "from-the-environment")
    assert load_signing_key(tmp_path, Settings().audit_signing_key) == b"from-the-environment"
    assert load_signing_key(tmp_path, SecretStr("explicit")) == b"explicit"
