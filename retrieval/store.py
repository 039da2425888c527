"""Ingest documents into per-(tenant, collection) indexes, manage them, and search them
(the query side is `ChunkSearch`, in chunk_search.py)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker
from tqdm import tqdm

from retrieval.chunk_search import ChunkSearch
from retrieval.chunking import chunk_sections
from retrieval.collection_indexes import CollectionIndexes
from retrieval.embedder import Embedder
from retrieval.ingestion import PendingDocument, chunk_count, plan_ingestion
from retrieval.loaders import (
    SUFFIX_KINDS,
    UnsupportedDocumentError,
    parse_document,
    parse_markdown,
)
from retrieval.models import Chunk, Document
from retrieval.names import check_name
from retrieval.rerank import LateInteractionReranker, Reranker
from retrieval.results import DocumentInfo, IngestResult
from retrieval.vector_index import APPROXIMATE_ABOVE

__all__ = ["DocumentStore"]

logger = logging.getLogger(__name__)


class DocumentStore:
    """Documents, chunks and their embeddings in the database; derived search indexes beside.

    The database is the source of truth: the faiss file of each collection is kept in step
    with it (save before commit, so a crash leaves at worst extra vectors, which `search`
    ignores and `rebuild_index` drops), and BM25 is rebuilt from it whenever the
    collection's chunks change, in this process or another. Use one store per `index_dir`
    per process. Chunk sizes are in `count_tokens` units when given, else characters.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        embedder: Embedder,
        index_dir: Path,
        *,
        reranker: Reranker | None = None,
        count_tokens: Callable[[str], int] | None = None,
        chunk_size: int | None = None,
        chunk_overlap: int | None = None,
        approximate_above: int = APPROXIMATE_ABOVE,
        query_embedder: Embedder | None = None,
    ) -> None:
        self._sessions = session_factory
        self._embedder = embedder
        self._count = count_tokens if count_tokens is not None else len
        self._chunk_size = chunk_size or (200 if count_tokens else 800)
        self._chunk_overlap = chunk_overlap if chunk_overlap is not None else self._chunk_size // 7
        self._indexes = CollectionIndexes(
            session_factory, embedder, Path(index_dir), approximate_above
        )
        # The query side lives in chunk_search.py; the store offers its `search` as its own.
        # Queries may go through the same model's embedder for requests (the gateway passes
        # `Embedder.for_requests`: bf16 where the CPU has it, cosine 0.9999 to float32, and it
        # has often just embedded the same user message); documents always go through
        # `embedder`.
        self.search = ChunkSearch(
            session_factory,
            embedder,
            query_embedder or embedder,
            reranker if reranker is not None else LateInteractionReranker(embedder),
            self._indexes,
        ).search

    # Ingestion ---------------------------------------------------------------------------

    def ingest_text(
        self, tenant: str, collection: str, source: str, text: str, title: str | None = None
    ) -> IngestResult:
        """Add or replace the Markdown or plain-text document at `source`."""
        return self.ingest_texts(tenant, collection, [(source, text)], titles=[title])[0]

    def ingest_texts(
        self,
        tenant: str,
        collection: str,
        documents: Sequence[tuple[str, str]],
        titles: Sequence[str | None] | None = None,
    ) -> list[IngestResult]:
        """Add or replace several (source, Markdown text) documents in one transaction.

        Much faster than one `ingest_text` each: one model pass, one commit, one index save.
        """
        items = [
            PendingDocument(
                source,
                parse_markdown(text),
                hashlib.sha256(text.encode("utf-8")).hexdigest(),
                titles[i] if titles is not None else None,
            )
            for i, (source, text) in enumerate(documents)
        ]
        return self._ingest(tenant, collection, items)

    def ingest_bytes(
        self,
        tenant: str,
        collection: str,
        filename: str,
        data: bytes,
        *,
        source: str | None = None,
        title: str | None = None,
    ) -> IngestResult:
        """Add or replace an uploaded file (.txt, .md, .html, .pdf, by name or content).

        `source` (default `filename`) identifies the document: the same source again
        replaces it. Raises UnsupportedDocumentError for types or content we cannot read.
        """
        item = PendingDocument(
            source or filename,
            parse_document(filename, data),
            hashlib.sha256(data).hexdigest(),
            title,
        )
        return self._ingest(tenant, collection, [item])[0]

    def ingest_paths(
        self,
        paths: Sequence[Path],
        tenant: str,
        collection: str,
        progress: bool = True,
        batch_size: int = 32,
    ) -> list[IngestResult]:
        """Ingest text, Markdown, HTML and PDF files, walking folders recursively.

        Files go in batches of `batch_size`, each batch in one transaction.
        """
        check_name("tenant", tenant)
        check_name("collection", collection)
        results: list[IngestResult] = []
        files = _supported_files(paths)
        with tqdm(
            total=len(files), desc=f"{tenant}/{collection}", unit="file", disable=not progress
        ) as bar:
            for start in range(0, len(files), batch_size):
                batch: list[PendingDocument] = []
                for path in files[start : start + batch_size]:
                    data = path.read_bytes()
                    try:
                        parsed = parse_document(path.name, data)
                    except UnsupportedDocumentError as error:
                        logger.warning("skipping %s: %s", path, error)
                        continue
                    batch.append(
                        PendingDocument(str(path), parsed, hashlib.sha256(data).hexdigest())
                    )
                results.extend(self._ingest(tenant, collection, batch))
                bar.update(len(files[start : start + batch_size]))
        return results

    def _ingest(
        self, tenant: str, collection: str, items: Sequence[PendingDocument]
    ) -> list[IngestResult]:
        check_name("tenant", tenant)
        check_name("collection", collection)
        if not items:
            return []
        with self._sessions() as session:
            plan = plan_ingestion(session, tenant, collection, items)
            pieces = [
                chunk_sections(
                    item.parsed.sections, self._chunk_size, self._chunk_overlap, self._count
                )
                for item in plan.to_write
            ]
            texts = [piece.text for chunks in pieces for piece in chunks]
            vectors, token_vectors = self._embedder.embed_with_tokens(texts)
            new_ids, stale_ids = plan.write(session, pieces, vectors, token_vectors)
            if len(new_ids) or stale_ids:
                self._indexes.commit_with_vectors(
                    session, tenant, collection, new_ids, vectors, stale_ids
                )
            return plan.results()

    # Documents ---------------------------------------------------------------------------

    def delete_document(self, tenant: str, document_id: str) -> bool:
        """Delete a tenant's document with its chunks and vectors; False if there is none."""
        check_name("tenant", tenant)
        with self._sessions() as session:
            doc = session.scalars(
                select(Document).where(Document.id == document_id, Document.tenant == tenant)
            ).one_or_none()
            if doc is None:
                return False
            collection = doc.collection
            ids = list(session.scalars(select(Chunk.id).where(Chunk.document_id == doc.id)))
            session.execute(delete(Chunk).where(Chunk.document_id == doc.id))
            session.delete(doc)
            session.commit()
        # After the commit: if this fails, the leftover vectors are ignored by `search`.
        self._indexes.remove_vectors(tenant, collection, ids)
        return True

    def list_documents(self, tenant: str, collection: str | None = None) -> list[DocumentInfo]:
        """The tenant's documents (of one collection, if given), by collection and source."""
        check_name("tenant", tenant)
        if collection is not None:
            check_name("collection", collection)
        counts = (
            select(Chunk.document_id, func.count().label("n"))
            .where(Chunk.tenant == tenant)
            .group_by(Chunk.document_id)
            .subquery()
        )
        query = (
            select(Document, func.coalesce(counts.c.n, 0))
            .outerjoin(counts, counts.c.document_id == Document.id)
            .where(Document.tenant == tenant)
            .order_by(Document.collection, Document.source)
        )
        if collection is not None:
            query = query.where(Document.collection == collection)
        with self._sessions() as session:
            return [_info(doc, int(n)) for doc, n in session.execute(query).all()]

    def get_document(self, tenant: str, document_id: str) -> DocumentInfo | None:
        """One of the tenant's documents, or None (also for another tenant's document)."""
        check_name("tenant", tenant)
        with self._sessions() as session:
            doc = session.scalars(
                select(Document).where(Document.id == document_id, Document.tenant == tenant)
            ).one_or_none()
            return None if doc is None else _info(doc, chunk_count(session, doc.id))

    def rebuild_index(self, tenant: str, collection: str) -> int:
        """Rebuild the collection's faiss file from the database; returns its vector count.

        Drops vectors a crash left behind and embeds chunks stored without an embedding.
        """
        check_name("tenant", tenant)
        check_name("collection", collection)
        return self._indexes.rebuild(tenant, collection)


def _info(doc: Document, chunks: int) -> DocumentInfo:
    return DocumentInfo(
        id=doc.id,
        tenant=doc.tenant,
        collection=doc.collection,
        title=doc.title,
        source=doc.source,
        kind=doc.kind,
        version=doc.version,
        content_hash=doc.content_hash,
        chunks=chunks,
        created_at=_utc(doc.created_at),
        ingested_at=_utc(doc.ingested_at) if doc.ingested_at else None,
    )


def _utc(moment: datetime) -> datetime:
    """SQLite keeps no offset: its times were stored in UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _supported_files(paths: Sequence[Path]) -> list[Path]:
    """Resolved, de-duplicated ingestible files under `paths`, in a stable order."""
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw).resolve()
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            candidates = [path]
        else:
            raise FileNotFoundError(f"no such file or folder: {raw}")
        for candidate in candidates:
            if candidate.suffix.lower() in SUFFIX_KINDS:
                found.setdefault(candidate.resolve(), None)
            else:
                logger.info("skipping %s: not a text, Markdown, HTML or PDF file", candidate)
    return list(found)
