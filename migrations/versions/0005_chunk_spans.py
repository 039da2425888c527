"""Chunk spans: each chunk's character offsets in its document's text, for citations.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("char_start", sa.Integer, nullable=True))
        batch.add_column(sa.Column("char_end", sa.Integer, nullable=True))


def downgrade() -> None:
    # Dropping columns recreates the table on SQLite; keep ids from ever being reused.
    with op.batch_alter_table("chunks", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("char_end")
        batch.drop_column("char_start")
