"""Every table of the gateway: API keys, the audit log and the audit subjects' keys.

Retrieval's tables live with it (`retrieval/models.py`); Alembic reads both."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, Index, Integer, LargeBinary, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utc_now() -> datetime:
    return datetime.now(UTC)


class GatewayBase(DeclarativeBase):
    pass


class ApiKey(GatewayBase):
    """An API key, stored only as the SHA-256 of its secret (keys are 256-bit random)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    prefix: Mapped[str] = mapped_column(String(16))
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)


class AuditRecord(GatewayBase):
    """One row per request or admin action: who, what each stage decided, the cost.

    Rows form a hash chain (`seq`, `prev_hash`, `record_hash`); see `gateway.audit.chain`.
    """

    __tablename__ = "audit_records"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    seq: Mapped[int] = mapped_column(Integer, unique=True)
    prev_hash: Mapped[str] = mapped_column(String(64))
    record_hash: Mapped[str] = mapped_column(String(64))
    event: Mapped[str] = mapped_column(String(64), default="chat.completion", index=True)
    request_id: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    endpoint: Mapped[str] = mapped_column(String(128))
    tenant: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    end_user: Mapped[str | None] = mapped_column(String(256), nullable=True)
    policy_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    outcome: Mapped[str] = mapped_column(String(32))
    status_code: Mapped[int] = mapped_column(Integer)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    verdicts: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    chunk_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    engine_ms: Mapped[float] = mapped_column(Float, default=0.0)
    prompt_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    answer_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    prompt_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    answer_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class AuditSubjectKey(GatewayBase):
    """One data subject's key; `key` is NULL once the subject was erased."""

    __tablename__ = "audit_subject_keys"
    __table_args__ = (
        Index("ix_audit_subject_keys_subject", "tenant", "subject"),
        # At most one live key per subject; erased rows stay as a record of the erasure.
        Index(
            "uq_audit_subject_keys_live",
            "tenant",
            "subject",
            unique=True,
            sqlite_where=text("erased_at IS NULL"),
            postgresql_where=text("erased_at IS NULL"),
        ),
        {"sqlite_autoincrement": True},  # a key id is never reused for another subject
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128))
    subject: Mapped[str] = mapped_column(String(256))
    key: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    erased_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
