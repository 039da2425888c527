"""API keys: an optional expiry and per-key rate limits.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("requests_per_minute", sa.Integer, nullable=True))
        batch.add_column(sa.Column("tokens_per_minute", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("tokens_per_minute")
        batch.drop_column("requests_per_minute")
        batch.drop_column("expires_at")
