"""Database tables for ingested documents and their chunks."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import (
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class RetrievalBase(DeclarativeBase):
    """Declarative base of the retrieval tables, separate from other packages' tables."""


def new_document_id() -> str:
    return uuid.uuid4().hex


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Document(RetrievalBase):
    """One ingested source (file, page) of a tenant's collection."""

    __tablename__ = "documents"
    __table_args__ = (
        UniqueConstraint("tenant", "collection", "source", name="uq_documents_source"),
        Index("ix_documents_content_hash", "tenant", "collection", "content_hash"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_document_id)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    collection: Mapped[str] = mapped_column(String(128))
    title: Mapped[str] = mapped_column(String(512))
    source: Mapped[str] = mapped_column(String(1024))
    content_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
    # Added by revision 0002.
    kind: Mapped[str] = mapped_column(String(16), default="text", server_default="text")
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    ingested_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), default=_utcnow, nullable=True
    )


class Chunk(RetrievalBase):
    """A piece of a document; its id is also its vector id in the faiss index."""

    __tablename__ = "chunks"
    __table_args__ = (
        Index("ix_chunks_tenant_collection", "tenant", "collection"),
        # SQLite would otherwise reuse the ids of deleted rows, and a stale vector left in an
        # index after a crash would then point at an unrelated chunk.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    document_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("documents.id", ondelete="CASCADE"), index=True
    )
    tenant: Mapped[str] = mapped_column(String(128))
    collection: Mapped[str] = mapped_column(String(128))
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    # Added by revision 0002. The embedding (float32 bytes) lets the index be rebuilt from
    # the database alone; rows from before 0002 have none and are embedded again.
    page: Mapped[int | None] = mapped_column(Integer, nullable=True)
    section: Mapped[str | None] = mapped_column(String(512), nullable=True)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # Late-interaction token vectors (int8, see rerank.pack_token_vectors), for reranking.
    token_vectors: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # Added by revision 0005: the chunk's span in its document's text (see TextChunk); rows
    # from before 0005 have none.
    char_start: Mapped[int | None] = mapped_column(Integer, nullable=True)
    char_end: Mapped[int | None] = mapped_column(Integer, nullable=True)
