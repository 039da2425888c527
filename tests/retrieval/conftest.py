"""Fixtures: one real embedding model per session, a fresh SQLite database per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from retrieval import DocumentStore, Embedder, RetrievalBase


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder.load()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{tmp_path / 'retrieval.db'}")

    @event.listens_for(engine, "connect")
    def _enable_foreign_keys(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    RetrievalBase.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@pytest.fixture
def index_dir(tmp_path: Path) -> Path:
    return tmp_path / "indexes"


@pytest.fixture
def store(
    session_factory: sessionmaker[Session], embedder: Embedder, index_dir: Path
) -> DocumentStore:
    return DocumentStore(session_factory, embedder, index_dir)
