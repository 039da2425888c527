"""Database connection: one SQLAlchemy engine per process, SQLite (WAL) or PostgreSQL."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

SqliteSynchronous = Literal["normal", "full"]


def make_db_engine(url: str, sqlite_synchronous: SqliteSynchronous = "normal") -> Engine:
    """Create the engine; SQLite gets WAL, a busy timeout and enforced foreign keys.

    `sqlite_synchronous` is SQLite's own setting. Under WAL, `normal` commits without an
    fsync: a commit survives the process crashing, and only the last commits before an
    operating-system crash or power cut can be lost (the file stays consistent). `full`
    also survives those, for one fsync a commit: a few milliseconds on the audit writer,
    which every answer waits for before its `[DONE]`.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute(f"PRAGMA synchronous={sqlite_synchronous.upper()}")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def is_sqlite(sessions: sessionmaker[Session]) -> bool:
    """Whether the sessions' database is SQLite: a file on this machine."""
    bind: Engine = sessions.kw["bind"]
    return bind.dialect.name == "sqlite"


def database_reachable(sessions: sessionmaker[Session]) -> bool:
    """Whether a trivial query succeeds now: readiness depends on it."""
    try:
        with sessions() as session:
            session.execute(text("SELECT 1"))
    except SQLAlchemyError:
        return False
    return True
