"""Database connection: one SQLAlchemy engine per process, SQLite (WAL) or PostgreSQL."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

SqliteSynchronous = Literal["normal", "full"]
_SQLITE_NORMAL = 1  # what `PRAGMA synchronous` reads for `normal`


def make_db_engine(
    url: str,
    sqlite_synchronous: SqliteSynchronous = "normal",
    *,
    sqlite_busy_timeout_s: float = 30.0,
    sqlite_autocheckpoint: bool = True,
) -> Engine:
    """Create the engine; SQLite gets WAL, a busy timeout and enforced foreign keys.

    `sqlite_synchronous` is SQLite's own setting. Under WAL, `normal` commits without an
    fsync: a commit survives the process crashing, and only the last commits before an
    operating-system crash or power cut can be lost (the file stays consistent). `full`
    also survives those, for one fsync a commit: a few milliseconds on the audit writer,
    which every answer waits for before its `[DONE]`.

    An engine used on the event loop waits for nothing: a busy timeout of 0, and no
    automatic checkpoint (a commit that crosses the WAL's threshold would copy it into the
    database file and fsync it); whoever turns it off checkpoints elsewhere.
    """
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": sqlite_busy_timeout_s}
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(sqlite_busy_timeout_s * 1000)}")
            cursor.execute(f"PRAGMA synchronous={sqlite_synchronous.upper()}")
            if not sqlite_autocheckpoint:
                cursor.execute("PRAGMA wal_autocheckpoint=0")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def loop_twin(engine: Engine) -> Engine | None:
    """An engine on the same SQLite file for writes made on the event loop, which wait for
    nothing (`make_db_engine`); None where a write would wait anyway: on the network
    (PostgreSQL), or on an fsync a commit (`synchronous=full`), or where a second engine
    would open another database (SQLite in memory)."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return None
    with engine.connect() as connection:
        synchronous = connection.exec_driver_sql("PRAGMA synchronous").scalar()
    if synchronous != _SQLITE_NORMAL:
        return None
    return make_db_engine(
        engine.url.render_as_string(hide_password=False),
        "normal",
        sqlite_busy_timeout_s=0,
        sqlite_autocheckpoint=False,
    )


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
