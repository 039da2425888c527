"""Audit subject keys: one AES key per data subject, so erasing a subject's key shreds the
text their audit records keep (crypto-shredding). Not append-only, unlike audit_records.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_subject_keys",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("key", sa.LargeBinary, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_subject_keys_subject", "audit_subject_keys", ["tenant", "subject"])
    op.create_index(
        "uq_audit_subject_keys_live",
        "audit_subject_keys",
        ["tenant", "subject"],
        unique=True,
        sqlite_where=sa.text("erased_at IS NULL"),
        postgresql_where=sa.text("erased_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("audit_subject_keys")
