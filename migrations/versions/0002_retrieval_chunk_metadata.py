"""Retrieval metadata: document kind, version and ingestion time; chunk page, section,
embedding and token vectors; an index for deduplication by content hash.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Batch mode: SQLite cannot alter tables in place; on PostgreSQL it is plain ALTER TABLE.
    with op.batch_alter_table("documents") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="text"))
        batch.add_column(sa.Column("version", sa.Integer, nullable=False, server_default="1"))
        batch.add_column(sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_documents_content_hash", "documents", ["tenant", "collection", "content_hash"]
    )
    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("page", sa.Integer, nullable=True))
        batch.add_column(sa.Column("section", sa.String(512), nullable=True))
        batch.add_column(sa.Column("embedding", sa.LargeBinary, nullable=True))
        batch.add_column(sa.Column("token_vectors", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    # Dropping columns recreates the table on SQLite; keep ids from ever being reused.
    with op.batch_alter_table("chunks", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("token_vectors")
        batch.drop_column("embedding")
        batch.drop_column("section")
        batch.drop_column("page")
    op.drop_index("ix_documents_content_hash", table_name="documents")
    with op.batch_alter_table("documents") as batch:
        batch.drop_column("ingested_at")
        batch.drop_column("version")
        batch.drop_column("kind")
