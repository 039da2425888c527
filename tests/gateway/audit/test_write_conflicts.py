"""Which database errors the audit chain retries: write conflicts yes, an outage or a
refusing trigger no."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError, OperationalError

from gateway.audit.chain import is_write_conflict


def test_a_locked_sqlite_file_is_a_conflict(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN EXCLUSIVE")
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    try:
        with pytest.raises(OperationalError) as caught, engine.begin() as connection:
            connection.execute(text("INSERT INTO t VALUES (1)"))
        assert is_write_conflict(caught.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        engine.dispose()


def test_an_unreachable_database_is_not_retried() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
    with pytest.raises(OperationalError) as caught, engine.connect():
        pass
    assert not is_write_conflict(caught.value)
    engine.dispose()


def test_a_taken_key_is_a_conflict_but_a_refusing_trigger_is_not(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'refusing.db'}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER UNIQUE)"))
        connection.execute(text("INSERT INTO t VALUES (1)"))
        connection.execute(
            text(
                "CREATE TRIGGER refuse BEFORE INSERT ON t WHEN NEW.x = 2 "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        )
    for value, conflict in ((1, True), (2, False)):
        with pytest.raises(IntegrityError) as caught, engine.begin() as connection:
            connection.execute(text(f"INSERT INTO t VALUES ({value})"))
        assert is_write_conflict(caught.value) is conflict
    engine.dispose()
