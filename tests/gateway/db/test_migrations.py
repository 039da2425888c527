"""The Alembic schema matches the models, on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import uuid

from sqlalchemy import inspect, select

from gateway.audit.log import AuditEntry, AuditLog
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database
from gateway.db.models import AuditRecord, GatewayBase
from guardrails import Verdict
from retrieval.models import RetrievalBase


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


def test_schema_matches_the_models(database_url: str) -> None:
    check_schema_and_audit_roundtrip(database_url)
