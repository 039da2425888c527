"""The Alembic schema matches the models, on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.exc import OperationalError

from gateway.audit import AuditEntry, AuditLog
from gateway.db import make_db_engine, make_session_factory
from gateway.migrations import upgrade_database
from gateway.models import AuditRecord, GatewayBase
from guardrails import Verdict
from retrieval.models import RetrievalBase

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def model_columns() -> dict[str, set[str]]:
    tables = {**GatewayBase.metadata.tables, **RetrievalBase.metadata.tables}
    return {name: {c.name for c in table.columns} for name, table in tables.items()}


def check_schema_and_audit_roundtrip(url: str) -> None:
    upgrade_database(url)
    engine = make_db_engine(url)
    inspector = inspect(engine)
    for table, columns in model_columns().items():
        assert {c["name"] for c in inspector.get_columns(table)} == columns, table
    request_id = f"req_{uuid.uuid4().hex}"
    AuditLog(make_session_factory(engine)).record(
        AuditEntry(
            request_id=request_id,
            endpoint="/v1/chat/completions",
            outcome="ok",
            status_code=200,
            verdicts=[Verdict("pii", "redact", 0.9, ("EMAIL x1",))],
        )
    )
    with make_session_factory(engine)() as session:
        row = session.scalars(select(AuditRecord).where(AuditRecord.request_id == request_id)).one()
    assert row.verdicts[0]["check"] == "pii" and row.verdicts[0]["evidence"] == ["EMAIL x1"]
    engine.dispose()


def test_sqlite_schema(tmp_path: Path) -> None:
    check_schema_and_audit_roundtrip(f"sqlite:///{tmp_path / 'bastion.db'}")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    schema = f"bastion_test_{uuid.uuid4().hex[:8]}"
    admin = create_engine(POSTGRES_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError:
        pytest.skip("no PostgreSQL server answers on 127.0.0.1:5432")
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def test_postgresql_schema(postgres_url: str) -> None:
    check_schema_and_audit_roundtrip(postgres_url)
