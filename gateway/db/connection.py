"""Database connection: one SQLAlchemy engine per process, SQLite (WAL) or PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker


def make_db_engine(url: str) -> Engine:
    """Create the engine; SQLite gets WAL, a busy timeout and enforced foreign keys."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def database_reachable(sessions: sessionmaker[Session]) -> bool:
    """Whether a trivial query succeeds now: readiness depends on it."""
    try:
        with sessions() as session:
            session.execute(text("SELECT 1"))
    except SQLAlchemyError:
        return False
    return True
