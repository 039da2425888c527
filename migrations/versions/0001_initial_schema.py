"""Initial schema: API keys, audit records, documents and chunks.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_api_keys_key_hash", "api_keys", ["key_hash"], unique=True)
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant"])

    op.create_table(
        "audit_records",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("seq", sa.Integer, nullable=False, unique=True),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("record_hash", sa.String(64), nullable=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("endpoint", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("end_user", sa.String(256), nullable=True),
        sa.Column("policy_version", sa.String(64), nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("status_code", sa.Integer, nullable=False),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("verdicts", sa.JSON, nullable=False),
        sa.Column("chunk_ids", sa.JSON, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("engine_ms", sa.Float, nullable=False),
        sa.Column("prompt_sha256", sa.String(64), nullable=True),
        sa.Column("answer_sha256", sa.String(64), nullable=True),
        sa.Column("prompt_text", sa.Text, nullable=True),
        sa.Column("answer_text", sa.Text, nullable=True),
        sa.Column("details", sa.JSON, nullable=False),
    )
    op.create_index("ix_audit_records_event", "audit_records", ["event"])
    _append_only_triggers()
    op.create_index("ix_audit_records_request_id", "audit_records", ["request_id"])
    op.create_index("ix_audit_records_tenant", "audit_records", ["tenant"])

    op.create_table(
        "documents",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("collection", sa.String(128), nullable=False),
        sa.Column("title", sa.String(512), nullable=False),
        sa.Column("source", sa.String(1024), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("tenant", "collection", "source", name="uq_documents_source"),
    )
    op.create_index("ix_documents_tenant", "documents", ["tenant"])

    op.create_table(
        "chunks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "document_id",
            sa.String(32),
            sa.ForeignKey("documents.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("collection", sa.String(128), nullable=False),
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_chunks_document_id", "chunks", ["document_id"])
    op.create_index("ix_chunks_tenant_collection", "chunks", ["tenant", "collection"])


# The audit log is append-only for the application: these triggers refuse UPDATE and DELETE.
# Retention purges switch them off inside their own transaction (see gateway.audit.chain).
_SQLITE_TRIGGERS = [
    """CREATE TRIGGER audit_records_no_update BEFORE UPDATE ON audit_records
    BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END""",
    """CREATE TRIGGER audit_records_no_delete BEFORE DELETE ON audit_records
    WHEN (SELECT COUNT(*) FROM audit_purge_grants) = 0
    BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END""",
]
_POSTGRES_TRIGGER = """
CREATE FUNCTION audit_records_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('bastion.audit_purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit records are append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_records_append_only BEFORE UPDATE OR DELETE ON audit_records
    FOR EACH ROW EXECUTE FUNCTION audit_records_append_only();
"""


def _append_only_triggers() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.create_table("audit_purge_grants", sa.Column("id", sa.Integer, primary_key=True))
        for statement in _SQLITE_TRIGGERS:
            op.execute(statement)
    elif dialect == "postgresql":
        op.execute(_POSTGRES_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_records_append_only ON audit_records")
        op.execute("DROP FUNCTION IF EXISTS audit_records_append_only()")
    op.drop_table("chunks")
    op.drop_table("documents")
    op.drop_table("audit_records")
    op.drop_table("api_keys")
    if op.get_bind().dialect.name == "sqlite":
        op.drop_table("audit_purge_grants")
