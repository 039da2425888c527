"""Audit records written on the event loop (a local SQLite file): one write a loop
iteration, no thread while the file is free, the writer thread when it is busy, and the
WAL copied into the database file on a thread since the loop's engine never does it."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from sqlalchemy import Engine

import gateway.audit.log as audit_log_module
from gateway.audit.chain import verify_chain
from gateway.audit.log import AuditLog
from gateway.audit.loop_commit import LoopGroupCommit
from gateway.db.connection import loop_twin, make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database
from tests.support.audit_entries import entry


def sqlite_file(tmp_path: Path) -> tuple[Path, Engine]:
    path = tmp_path / "audit.db"
    url = f"sqlite:///{path}"
    upgrade_database(url)
    return path, make_db_engine(url)


def writer_threads() -> set[threading.Thread]:
    """The audit writer threads alive now (an idle one lingers a second after its work)."""
    return {t for t in threading.enumerate() if t.name == "audit-writer"}


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_records_of_one_loop_iteration_are_written_together_without_a_thread(
    tmp_path: Path,
) -> None:
    _, engine = sqlite_file(tmp_path)
    sessions = make_session_factory(engine)
    log = AuditLog(sessions)
    names = [f"stream_{n}" for n in range(32)]
    earlier = writer_threads()  # other tests' logs'

    async def write_all() -> list[str]:
        kept = [entry(name, text_kept=True) for name in names]
        rows = await asyncio.gather(*(log.record_async(e) for e in kept))
        return [row.request_id for row in rows]

    assert asyncio.run(write_all()) == names
    asyncio.run(log.record_async(entry("alone", text_kept=True)))
    assert writer_threads() <= earlier  # no thread was started for them
    report = verify_chain(sessions)
    assert report.ok, report.problems
    assert report.records == len(names) + 1
    engine.dispose()


def test_a_busy_file_hands_the_records_to_the_writer_thread(tmp_path: Path) -> None:
    path, engine = sqlite_file(tmp_path)
    sessions = make_session_factory(engine)
    log = AuditLog(sessions)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the file
    earlier = writer_threads()

    async def write_while_held() -> list[str]:
        held = [entry(f"held_{n}", text_kept=True) for n in range(5)]
        tasks = [asyncio.ensure_future(log.record_async(e)) for e in held]
        await asyncio.sleep(0.3)
        assert not any(task.done() for task in tasks)  # waiting, on the thread
        assert writer_threads() - earlier
        holder.execute("ROLLBACK")
        return [row.request_id for row in await asyncio.gather(*tasks)]

    try:
        assert asyncio.run(write_while_held()) == [f"held_{n}" for n in range(5)]
    finally:
        holder.close()
    report = verify_chain(sessions)
    assert report.ok, report.problems
    assert report.records == 5
    engine.dispose()


def test_the_wal_is_checkpointed_on_a_thread_every_so_many_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_log_module, "_CHECKPOINT_EVERY", 3)
    path, engine = sqlite_file(tmp_path)
    log = AuditLog(make_session_factory(engine))
    with sqlite3.connect(path) as settle:  # everything so far into the database file
        settle.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = file_digest(path)

    async def write(names: list[str]) -> None:
        for name in names:  # one commit each
            await log.record_async(entry(name, text_kept=True))

    asyncio.run(write(["one", "two"]))
    # The loop's engine does not checkpoint: the records are in the WAL only.
    assert file_digest(path) == before
    asyncio.run(write(["three"]))
    deadline = time.monotonic() + 10
    while file_digest(path) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert file_digest(path) != before
    engine.dispose()


def test_only_a_local_sqlite_file_without_an_fsync_a_commit_is_written_on_the_loop(
    tmp_path: Path,
) -> None:
    assert loop_twin(make_db_engine("sqlite://")) is None  # in memory: another database
    # Decided by the dialect, before any connection: a network database is never.
    assert loop_twin(make_db_engine("postgresql+psycopg://nobody@127.0.0.1:9/none")) is None
    assert loop_twin(make_db_engine(f"sqlite:///{tmp_path / 'full.db'}", "full")) is None
    twin = loop_twin(make_db_engine(f"sqlite:///{tmp_path / 'normal.db'}"))
    assert twin is not None
    with twin.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 0
        assert connection.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
    twin.dispose()


def test_a_failed_write_fails_each_waiter_and_a_cancelled_one_is_written_all_the_same() -> None:
    written: list[list[str]] = []

    def try_write(items: list[str]) -> list[str | BaseException]:
        written.append(items)
        if "poison" in items:
            raise RuntimeError("refused")
        return [item.upper() for item in items]

    def hand_over(item: str) -> Future[str]:
        raise AssertionError(f"{item} was handed over, but the write did not wait")

    commit = LoopGroupCommit(try_write, hand_over)

    async def scenario() -> tuple[list[str | BaseException], list[str | BaseException]]:
        first = [asyncio.ensure_future(commit.submit(item)) for item in ("a", "poison", "b")]
        failed = await asyncio.gather(*first, return_exceptions=True)
        cancelled = asyncio.ensure_future(commit.submit("cancelled"))
        kept = asyncio.ensure_future(commit.submit("kept"))
        await asyncio.sleep(0)  # both handed in
        cancelled.cancel()
        return failed, list(await asyncio.gather(kept, return_exceptions=True))

    failed, kept = asyncio.run(scenario())
    assert all(isinstance(outcome, RuntimeError) for outcome in failed)
    assert kept == ["KEPT"]
    assert written == [["a", "poison", "b"], ["cancelled", "kept"]]


def test_what_cannot_be_written_now_is_settled_by_the_hand_over() -> None:
    def try_write(_: list[str]) -> None:
        return None  # busy

    def hand_over(item: str) -> Future[str]:
        future: Future[str] = Future()
        if item == "bad":
            future.set_exception(ValueError("no room"))
        else:
            threading.Timer(0.05, future.set_result, args=(f"{item} later",)).start()
        return future

    commit = LoopGroupCommit(try_write, hand_over)

    async def scenario() -> list[str | BaseException]:
        return list(
            await asyncio.gather(
                commit.submit("good"), commit.submit("bad"), return_exceptions=True
            )
        )

    good, bad = asyncio.run(scenario())
    assert good == "good later"
    assert isinstance(bad, ValueError)
