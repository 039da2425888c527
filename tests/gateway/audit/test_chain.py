"""The audit chain: verification catches every kind of tampering, on SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import make_checkpoint, verify_chain
from gateway.audit.log import AuditEntry, AuditLog
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database


def open_log(url: str) -> tuple[Engine, sessionmaker[Session], AuditLog]:
    upgrade_database(url)
    engine = make_db_engine(url)
    sessions = make_session_factory(engine)
    return engine, sessions, AuditLog(sessions)


def entry(n: int) -> AuditEntry:
    return AuditEntry(
        request_id=f"req_{n}",
        endpoint="/v1/chat/completions",
        outcome="ok",
        status_code=200,
        tenant="acme",
        prompt_tokens=n,
    )


def disable_protection(engine: Engine) -> None:
    """What an attacker with database access would do first."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.execute(text("DROP TRIGGER audit_records_no_update"))
            conn.execute(text("DROP TRIGGER audit_records_no_delete"))
        else:
            conn.execute(text("ALTER TABLE audit_records DISABLE TRIGGER USER"))


def tamper(engine: Engine, *statements: str) -> None:
    disable_protection(engine)
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


@pytest.fixture
def filled(database_url: str) -> tuple[Engine, sessionmaker[Session]]:
    engine, sessions, log = open_log(database_url)
    for n in range(1, 7):
        log.record(entry(n))
    return engine, sessions


def test_an_untouched_chain_verifies(filled: tuple[Engine, sessionmaker[Session]]) -> None:
    report = verify_chain(filled[1])
    assert report.ok, report.problems
    assert (report.records, report.head_seq) == (6, 6)


def test_updates_and_deletes_are_refused_by_the_database(
    filled: tuple[Engine, sessionmaker[Session]],
) -> None:
    engine = filled[0]
    for statement in (
        "UPDATE audit_records SET tenant = 'evil'",
        "DELETE FROM audit_records WHERE seq = 2",
    ):
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(text(statement))
    assert verify_chain(filled[1]).ok


@pytest.mark.parametrize(
    ("statements", "expected"),
    [
        (["UPDATE audit_records SET prompt_tokens = 999 WHERE seq = 3"], "record 3 was modified"),
        (["DELETE FROM audit_records WHERE seq = 4"], "records 4..4 are missing"),
        # Insert: shift the tail up by one and put a forged record in the gap.
        (
            [
                "UPDATE audit_records SET seq = seq + 100 WHERE seq >= 3",
                "UPDATE audit_records SET seq = seq - 99 WHERE seq >= 103",
                "INSERT INTO audit_records (seq, prev_hash, record_hash, event, request_id, "
                "created_at, endpoint, outcome, status_code, verdicts, chunk_ids, prompt_tokens, "
                "completion_tokens, latency_ms, engine_ms, details) SELECT 3, record_hash, "
                "record_hash, event, 'forged', created_at, endpoint, outcome, status_code, "
                "verdicts, chunk_ids, 0, 0, 0, 0, details FROM audit_records WHERE seq = 2",
            ],
            "record 3",
        ),
        # Reorder: swap records 2 and 5.
        (
            [
                "UPDATE audit_records SET seq = 100 WHERE seq = 2",
                "UPDATE audit_records SET seq = 2 WHERE seq = 5",
                "UPDATE audit_records SET seq = 5 WHERE seq = 100",
            ],
            "record 2 does not follow record 1",
        ),
    ],
    ids=["edit", "delete", "insert", "reorder"],
)
def test_tampering_is_detected_and_located(
    filled: tuple[Engine, sessionmaker[Session]], statements: list[str], expected: str
) -> None:
    engine, sessions = filled
    tamper(engine, *statements)
    report = verify_chain(sessions)
    assert not report.ok
    assert any(expected in problem for problem in report.problems), report.problems


def test_truncation_after_a_checkpoint_is_detected(
    filled: tuple[Engine, sessionmaker[Session]], tmp_path: Path
) -> None:
    engine, sessions = filled
    checkpoint = make_checkpoint(sessions)
    assert checkpoint.seq == 6
    assert verify_chain(sessions, checkpoint).ok
    tamper(engine, "DELETE FROM audit_records WHERE seq >= 5")
    assert verify_chain(sessions).ok  # without the checkpoint the shorter chain looks whole
    report = verify_chain(sessions, checkpoint)
    assert any("truncated" in problem for problem in report.problems), report.problems


def _write_many(url: str, writer: int, count: int) -> None:
    engine, _, log = open_log(url)
    for n in range(count):
        log.record(
            AuditEntry(
                request_id=f"w{writer}-{n}-{uuid.uuid4().hex[:6]}",
                endpoint="/v1/chat/completions",
                outcome="ok",
                status_code=200,
            )
        )
    engine.dispose()


@pytest.mark.slow
def test_concurrent_writer_processes_build_one_chain(postgres_url: str) -> None:
    engine, sessions, _ = open_log(postgres_url)
    context = multiprocessing.get_context("spawn")
    # Each spawned process imports the guardrails package (tens of seconds on a busy
    # 2-core machine), hence the generous timeout.
    writers = [context.Process(target=_write_many, args=(postgres_url, w, 25)) for w in range(8)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=300)
        assert process.exitcode == 0
    report = verify_chain(sessions)
    assert report.ok, report.problems
    assert report.records == report.head_seq == 8 * 25
    engine.dispose()


def test_writers_that_take_turns_extend_one_chain(database_url: str) -> None:
    """Two writers on one database, as a server and `bastion audit` beside it: each links
    onto the real head, although the other appended since its own last record."""
    engine, sessions, first = open_log(database_url)
    second = AuditLog(sessions)
    head_reads: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _executing(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "ORDER BY audit_records.seq DESC" in statement:
            head_reads.append(statement)

    written = [
        log.record(entry(n)) for n, log in enumerate([first, first, second, first, second], 1)
    ]
    assert [r.seq for r in written] == [1, 2, 3, 4, 5]
    assert [r.prev_hash for r in written[1:]] == [r.record_hash for r in written[:-1]]
    report = verify_chain(sessions)
    assert report.ok and report.records == 5, report.problems
    if engine.dialect.name == "sqlite":
        # A writer reads the head once, then again only after the other wrote.
        assert len(head_reads) == 4
    engine.dispose()
