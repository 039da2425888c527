"""Databases for gateway tests: a SQLite file, and the real PostgreSQL when one answers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'bastion.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh schema in the `test` database, dropped afterwards; skipped without a server."""
    schema = f"bastion_test_{uuid.uuid4().hex[:8]}"
    admin = create_engine(POSTGRES_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError:
        admin.dispose()
        pytest.skip("no PostgreSQL server answers on 127.0.0.1:5432")
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    return str(request.getfixturevalue(name))
