"""Group commit of audit records, on a SQLite file and PostgreSQL: records that wait together
share one transaction, yet each is its own link of one chain that verifies, in the order
they came; a failed transaction fails every record in it, and only those."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import AppendedRecord, AuditChain, AuditWriteError, verify_chain
from gateway.audit.log import AuditLog
from gateway.audit.subject_keys import TextOpener
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database
from gateway.db.models import AuditRecord
from tests.support.audit_entries import entry


class Database:
    """A migrated database, watched: which transactions inserted audit records and how
    often the subjects' keys were read (by any engine on it: a SQLite file's records are
    written on the event loop through an engine of their own), and when the writer thread
    has begun a transaction on the chain (it has taken a batch)."""

    def __init__(self, url: str) -> None:
        upgrade_database(url)
        self.url = url
        self.engine: Engine = make_db_engine(url)
        self.sessions: sessionmaker[Session] = make_session_factory(self.engine)
        # Opened now: a SQLite connection's first pragmas need the file unlocked.
        self.engine.connect().close()
        self.audit_commits = 0
        self.batch_taken = threading.Event()
        self.key_reads = 0
        inserting: set[int] = set()

        def _executing(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if conn.engine.url != self.engine.url:
                return
            if statement.lstrip().upper().startswith("INSERT INTO AUDIT_RECORDS"):
                inserting.add(id(conn))
            elif (
                statement.lstrip().upper().startswith("SELECT")
                and "audit_subject_keys" in statement
            ):
                self.key_reads += 1

        def _committed(conn: Any) -> None:
            if id(conn) in inserting:
                inserting.discard(id(conn))
                self.audit_commits += 1

        self._listeners = [("before_cursor_execute", _executing), ("commit", _committed)]
        for name, listener in self._listeners:
            event.listen(Engine, name, listener)

        @event.listens_for(self.engine, "before_cursor_execute")
        def _writer_took_a_batch(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            # PostgreSQL's writer first takes the chain's lock, SQLite's reads the head.
            if (
                "pg_advisory_xact_lock" in statement
                or "ORDER BY audit_records.seq DESC" in statement
            ):
                self.batch_taken.set()

    def close(self) -> None:
        for name, listener in self._listeners:
            event.remove(Engine, name, listener)
        self.engine.dispose()

    def rows(self) -> list[AuditRecord]:
        with self.sessions() as session:
            return list(session.scalars(select(AuditRecord).order_by(AuditRecord.seq)))

    @contextmanager
    def chain_held(self) -> Iterator[None]:
        """Another writer holds the chain (PostgreSQL's advisory lock, SQLite's write
        lock) until the block ends: the audit writer queues behind it."""
        if self.engine.dialect.name == "postgresql":
            with self.engine.connect() as holder:
                holder.execute(text(f"SELECT pg_advisory_lock({AuditChain._ADVISORY_LOCK})"))
                try:
                    yield
                finally:
                    holder.execute(text(f"SELECT pg_advisory_unlock({AuditChain._ADVISORY_LOCK})"))
            return
        holder = sqlite3.connect(self.engine.url.database or "", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    def refuse_request(self, request_id: str) -> None:
        """A trigger that makes the database refuse the record of `request_id`."""
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                conn.execute(
                    text(
                        "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN "
                        f"IF NEW.request_id = '{request_id}' THEN RAISE EXCEPTION 'refused'; "
                        "END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
                    )
                )
                conn.execute(
                    text(
                        "CREATE TRIGGER refuse_poison BEFORE INSERT ON audit_records "
                        "FOR EACH ROW EXECUTE FUNCTION refuse_poison()"
                    )
                )
            else:
                conn.execute(
                    text(
                        "CREATE TRIGGER refuse_poison BEFORE INSERT ON audit_records "
                        f"WHEN NEW.request_id = '{request_id}' "
                        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
                    )
                )


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.close()


def assert_one_contiguous_chain(db: Database, request_ids: list[str]) -> None:
    rows = db.rows()
    assert [r.request_id for r in rows] == request_ids
    assert [r.seq for r in rows] == list(range(1, len(request_ids) + 1))
    report = verify_chain(db.sessions)
    assert report.ok, report.problems


def test_records_from_many_threads_share_transactions_and_verify(db: Database) -> None:
    log = AuditLog(db.sessions)
    names = [f"thread_{n}" for n in range(40)]
    rows: dict[str, AppendedRecord] = {}
    start = threading.Barrier(len(names) + 1)

    def write(name: str) -> None:
        start.wait()
        rows[name] = log.record(entry(name))

    threads = [threading.Thread(target=write, args=(name,)) for name in names]
    with db.chain_held():  # so that they all wait at once, whatever the machine's load
        for thread in threads:
            thread.start()
        start.wait()
        db.batch_taken.wait(10)
        time.sleep(0.5)  # the threads hand their entries over meanwhile
    for thread in threads:
        thread.join(30)
    assert sorted(rows) == sorted(names)
    assert all(rows[name].request_id == name for name in names)  # each caller its own row
    by_seq = [r.request_id for r in sorted(rows.values(), key=lambda r: r.seq)]
    assert_one_contiguous_chain(db, by_seq)
    assert db.audit_commits < len(names) // 4


def test_records_from_the_event_loop_keep_their_order(db: Database) -> None:
    log = AuditLog(db.sessions)
    names = [f"stream_{n}" for n in range(32)]

    async def write_all() -> list[AppendedRecord]:
        with db.chain_held():
            tasks = [asyncio.ensure_future(log.record_async(entry(name))) for name in names]
            await asyncio.sleep(0)  # every task has handed its entry to the writer
        return await asyncio.gather(*tasks)

    rows = asyncio.run(write_all())
    assert [r.request_id for r in rows] == names
    assert_one_contiguous_chain(db, names)
    assert [r.prev_hash for r in rows[1:]] == [r.record_hash for r in rows[:-1]]
    assert db.audit_commits <= 2
    # One record alone is written at once, in a transaction of its own.
    asyncio.run(log.record_async(entry("alone")))
    assert db.audit_commits <= 3
    assert db.rows()[-1].request_id == "alone"


def test_a_failed_transaction_fails_every_record_in_it(db: Database) -> None:
    db.refuse_request("poison")
    log = AuditLog(db.sessions)
    batch = ["before_poison", "poison", "after_poison_1", "after_poison_2"]

    async def write_all() -> tuple[AppendedRecord, list[AppendedRecord | BaseException]]:
        with db.chain_held():
            first = asyncio.ensure_future(log.record_async(entry("first")))
            await asyncio.to_thread(db.batch_taken.wait, 10)  # the writer took `first` alone
            tasks = [asyncio.ensure_future(log.record_async(entry(name))) for name in batch]
            await asyncio.sleep(0)
        return await first, await asyncio.gather(*tasks, return_exceptions=True)

    first, outcomes = asyncio.run(write_all())
    assert first.request_id == "first"
    assert all(isinstance(o, AuditWriteError) for o in outcomes), outcomes
    assert len({id(o) for o in outcomes}) == len(batch)  # each waiter its own error
    assert "refused" in str(outcomes[0])
    # Nothing of the failed transaction is in the chain, and the writer goes on.
    log.record(entry("later"))
    assert_one_contiguous_chain(db, ["first", "later"])


def test_a_cancelled_waiter_still_gets_its_record(db: Database) -> None:
    log = AuditLog(db.sessions)

    async def cancel_one() -> None:
        with db.chain_held():
            task = asyncio.ensure_future(log.record_async(entry("cancelled")))
            await asyncio.sleep(0)
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_one())
    log.record(entry("next"))  # queued behind it: once this is written, so is the other
    assert_one_contiguous_chain(db, ["cancelled", "next"])


def test_records_written_together_share_one_key_read_and_keep_their_subjects_text(
    db: Database,
) -> None:
    log = AuditLog(db.sessions)
    known = [f"known_{subject}" for subject in ("key_a", "key_b", "key_c")]
    for name in known:  # each subject's key exists before the burst
        log.record(entry(name, name.removeprefix("known_"), text_kept=True))
    subjects = ["key_a", "key_b", "key_a", "key_c", "key_b"] * 3
    names = [f"sealed_{n}" for n in range(len(subjects))]
    db.key_reads = 0

    async def write_all() -> list[AppendedRecord]:
        with db.chain_held():
            tasks = [
                asyncio.ensure_future(log.record_async(entry(name, subject, text_kept=True)))
                for name, subject in zip(names, subjects, strict=True)
            ]
            await asyncio.sleep(0)
        return await asyncio.gather(*tasks)

    asyncio.run(write_all())
    assert_one_contiguous_chain(db, known + names)
    # One read of the keys a write: the batch the writer took first, then all the rest
    # (a read a record would be 15).
    assert db.key_reads <= 2
    with db.sessions() as session:
        opener = TextOpener(session)
        rows = session.scalars(select(AuditRecord).order_by(AuditRecord.seq)).all()[3:]
        assert [opener.open(r.prompt_text) for r in rows] == [f"prompt of {n}" for n in names]
        key_ids = [r.prompt_text.split(":")[2] for r in rows if r.prompt_text]
    # The same subject's records are sealed with its one key, others' with their own.
    by_subject = {
        s: {k for k, t in zip(key_ids, subjects, strict=True) if t == s} for s in subjects
    }
    assert all(len(ids) == 1 for ids in by_subject.values())
    assert len(set().union(*by_subject.values())) == 3
