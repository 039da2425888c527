"""Data the store hands out: ingestion results, documents, search hits and filters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

IngestStatus = Literal["created", "updated", "unchanged", "duplicate"]
SearchMode = Literal["hybrid", "dense", "lexical"]


@dataclass
class IngestResult:
    """`duplicate`: the same content is already in the collection under another source;
    `document_id` is then that document's."""

    document_id: str
    chunks: int
    status: IngestStatus
    version: int = 1


@dataclass(frozen=True)
class RetrievedChunk:
    """A search hit. `score` orders the hits (reranker, fused, cosine or BM25 score, by
    how the search ran); `dense_score` is the query-chunk cosine, which `min_score` gates.
    `char_start`:`char_end` is the chunk's span in its document's text (see TextChunk);
    None for chunks stored before spans were recorded."""

    document_id: str
    chunk_id: int
    title: str
    source: str
    text: str
    score: float
    collection: str = ""
    ordinal: int = 0
    section: str | None = None
    page: int | None = None
    char_start: int | None = None
    char_end: int | None = None
    version: int = 1
    ingested_at: datetime | None = None
    dense_score: float | None = None


@dataclass(frozen=True)
class DocumentInfo:
    """A document's metadata, as the document API lists it."""

    id: str
    tenant: str
    collection: str
    title: str
    source: str
    kind: str
    version: int
    content_hash: str
    chunks: int
    created_at: datetime
    ingested_at: datetime | None


@dataclass(frozen=True)
class SearchFilter:
    """Restricts a search to chunks matching every field that is set."""

    document_ids: Sequence[str] | None = None
    source_prefix: str | None = None
    kinds: Sequence[str] | None = None
    section_prefix: str | None = None
    pages: tuple[int, int] | None = None
    ingested_after: datetime | None = None
    ingested_before: datetime | None = None
