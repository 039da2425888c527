"""Ingest documents into per-(tenant, collection) indexes and search them."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, defer, sessionmaker
from tqdm import tqdm

from retrieval.chunking import chunk_sections
from retrieval.collection_indexes import CollectionIndexes
from retrieval.embedder import Embedder
from retrieval.hybrid_search import (
    FEEDBACK_CHUNKS,
    FEEDBACK_TERMS,
    expand_vector,
    filter_conditions,
    fuse,
    fuse_with_reranker,
    top_ids,
)
from retrieval.ingestion import PendingDocument, chunk_count, plan_ingestion
from retrieval.lexical import LexicalIndex
from retrieval.loaders import (
    SUFFIX_KINDS,
    UnsupportedDocumentError,
    parse_document,
    parse_markdown,
)
from retrieval.models import Chunk, Document
from retrieval.rerank import (
    Candidate,
    LateInteractionReranker,
    Reranker,
    unpack_token_vectors,
)
from retrieval.results import (
    DocumentInfo,
    IngestResult,
    RetrievedChunk,
    SearchFilter,
    SearchMode,
)
from retrieval.vector_index import APPROXIMATE_ABOVE

__all__ = ["DocumentStore", "IngestResult", "RetrievedChunk"]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_TITLE_MAX = 512
_SECTION_MAX = 512
# Filters matching at most this many chunks are searched exactly from stored embeddings.
_EXACT_FILTERED_MAX = 20_000


def _check_name(kind: str, value: str) -> None:
    """Tenant and collection names become path parts, so only plain names are allowed."""
    if not _NAME.match(value) or value in {".", ".."}:
        raise ValueError(
            f"invalid {kind} name {value!r}: use 1-128 letters, digits, '_', '.' or '-' "
            "(and not '.' or '..')"
        )


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
        # Queries may go through a faster copy of the same model (the gateway passes the
        # bf16 request copy: cosine 0.9999 to float32, and it has often just embedded the
        # same user message); documents always go through `embedder`.
        self._query_embedder = query_embedder or embedder
        self._reranker = reranker if reranker is not None else LateInteractionReranker(embedder)
        self._count = count_tokens if count_tokens is not None else len
        self._chunk_size = chunk_size or (200 if count_tokens else 800)
        self._chunk_overlap = chunk_overlap if chunk_overlap is not None else self._chunk_size // 7
        self._indexes = CollectionIndexes(
            session_factory, embedder, Path(index_dir), approximate_above
        )

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
        _check_name("tenant", tenant)
        _check_name("collection", collection)
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
        _check_name("tenant", tenant)
        _check_name("collection", collection)
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
        _check_name("tenant", tenant)
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
        _check_name("tenant", tenant)
        if collection is not None:
            _check_name("collection", collection)
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
        _check_name("tenant", tenant)
        with self._sessions() as session:
            doc = session.scalars(
                select(Document).where(Document.id == document_id, Document.tenant == tenant)
            ).one_or_none()
            return None if doc is None else _info(doc, chunk_count(session, doc.id))

    def rebuild_index(self, tenant: str, collection: str) -> int:
        """Rebuild the collection's faiss file from the database; returns its vector count.

        Drops vectors a crash left behind and embeds chunks stored without an embedding.
        """
        _check_name("tenant", tenant)
        _check_name("collection", collection)
        return self._indexes.rebuild(tenant, collection)

    # Search ------------------------------------------------------------------------------

    def search(
        self,
        tenant: str,
        collections: Sequence[str],
        query: str,
        top_k: int = 4,
        min_score: float = 0.0,
        *,
        mode: SearchMode = "hybrid",
        rerank: bool = True,
        filters: SearchFilter | None = None,
        candidates: int = 20,
        feedback: bool = True,
    ) -> list[RetrievedChunk]:
        """The `top_k` chunks of the tenant's `collections` that best answer `query`.

        `mode` picks dense (faiss), lexical (BM25) or both fused by reciprocal rank. With
        `feedback`, the best first hits expand the query (pseudo-relevance feedback) and the
        search runs again with it. The best `candidates` of that are reranked when `rerank`.
        Chunks whose cosine similarity to the query is below `min_score` are dropped,
        whichever way they were found.
        """
        _check_name("tenant", tenant)
        names = list(dict.fromkeys(collections))
        for name in names:
            _check_name("collection", name)
        if not names or top_k <= 0 or not query.strip():
            return []
        pool = max(candidates, top_k)
        query_tokens: np.ndarray | None = None
        if rerank:
            # One pass of the model gives the reranker the query's token vectors too.
            vectors, tokens = self._query_embedder.embed_with_tokens([query])
            vector, query_tokens = vectors[0], tokens[0]
        else:
            vector = self._query_embedder.embed([query])[0]
        with self._sessions() as session:
            allowed = self._allowed_ids(session, tenant, names, filters)
            lexical = [
                self._indexes.lexical(session, tenant, name)
                for name in (names if mode in ("hybrid", "lexical") else [])
            ]
            search = _Search(tenant, names, mode, pool, allowed, lexical)
            rankings = self._rankings(session, search, vector, query, [])
            fused = fuse(rankings)
            if feedback and fused:
                best = top_ids(fused, FEEDBACK_CHUNKS)
                expanded = expand_vector(vector, self._embeddings(session, tenant, best))
                terms = _expansion_terms(search, query, best)
                rankings = self._rankings(session, search, expanded, query, terms)
                fused = fuse(rankings)
            pool_ids = top_ids(fused, pool)
            rows = session.execute(
                select(Chunk, Document)
                .join(Document, Chunk.document_id == Document.id)
                .where(Chunk.id.in_(pool_ids), Chunk.tenant == tenant, Chunk.collection.in_(names))
                # Token vectors are large and only the reranker reads them.
                .options(*([] if rerank else [defer(Chunk.token_vectors)]))
            ).all()
            cosines = self._cosines(vector, [chunk for chunk, _ in rows])
            kept = [(c, d) for c, d in rows if cosines[c.id] >= min_score]
            scores = {c.id: fused[c.id] for c, _ in kept}
            if rerank and kept:
                candidates_ = [
                    Candidate(
                        c.id,
                        c.text,
                        None if c.token_vectors is None else unpack_token_vectors(c.token_vectors),
                    )
                    for c, _ in kept
                ]
                reranked = self._reranker.score(query, candidates_, query_tokens)
                scores = fuse_with_reranker(
                    rankings, [c.id for c, _ in kept], reranked, self._reranker.fusion_weight
                )
            hits = [_hit(c, d, scores[c.id], cosines[c.id]) for c, d in kept]
        hits.sort(key=lambda hit: (-hit.score, hit.chunk_id))
        return hits[:top_k]

    def _rankings(
        self,
        session: Session,
        search: _Search,
        vector: np.ndarray,
        query: str,
        expansion: list[str],
    ) -> list[list[int]]:
        rankings: list[list[int]] = []
        if search.mode in ("hybrid", "dense"):
            rankings.append(
                self._dense_ranking(
                    session, search.tenant, search.names, vector, search.pool, search.allowed
                )
            )
        if search.lexical:
            found: dict[int, float] = {}
            for index in search.lexical:
                found.update(index.search(query, search.pool, search.allowed, expansion))
            rankings.append(top_ids(found, search.pool))
        return rankings

    def _embeddings(self, session: Session, tenant: str, ids: list[int]) -> np.ndarray:
        # The tenant is checked here, not in SQL: there SQLite would pick the tenant index
        # and scan the whole tenant's chunks instead of looking up a few primary keys.
        rows = session.execute(select(Chunk.tenant, Chunk.embedding).where(Chunk.id.in_(ids)))
        vectors = [
            np.frombuffer(blob, np.float32)
            for owner, blob in rows
            if owner == tenant and blob is not None
        ]
        return np.stack(vectors) if vectors else np.zeros((0, self._embedder.dimension), np.float32)

    def _allowed_ids(
        self, session: Session, tenant: str, names: list[str], filters: SearchFilter | None
    ) -> set[int] | None:
        if filters is None:
            return None
        conditions = filter_conditions(filters)
        if not conditions:
            return None
        query = (
            select(Chunk.id)
            .join(Document, Chunk.document_id == Document.id)
            .where(Chunk.tenant == tenant, Chunk.collection.in_(names), *conditions)
        )
        return set(session.scalars(query))

    def _dense_ranking(
        self,
        session: Session,
        tenant: str,
        names: list[str],
        vector: np.ndarray,
        k: int,
        allowed: set[int] | None,
    ) -> list[int]:
        if allowed is not None and len(allowed) <= _EXACT_FILTERED_MAX:
            ids, vectors = self._indexes.stored_vectors(session, tenant, None, sorted(allowed))
            scores = vectors @ vector
            order = np.argsort(-scores, kind="stable")[:k]
            return [int(ids[i]) for i in order]
        # Over-fetch: vectors of uncommitted or deleted chunks, or filtered out, are skipped.
        fetch = k * 2 if allowed is None else k * 10
        found: dict[int, float] = {}
        with self._indexes.lock:
            for name in names:
                index = self._indexes.existing_vectors(tenant, name, session)
                if index is None:
                    continue
                for chunk_id, score in index.search(vector, fetch):
                    if allowed is None or chunk_id in allowed:
                        found[chunk_id] = score
        return top_ids(found, k)

    def _cosines(self, vector: np.ndarray, chunks: Sequence[Chunk]) -> dict[int, float]:
        stored = [c for c in chunks if c.embedding is not None]
        missing = [c for c in chunks if c.embedding is None]
        result = {
            c.id: float(np.frombuffer(c.embedding or b"", np.float32) @ vector) for c in stored
        }
        if missing:
            embedded = self._embedder.embed([c.text for c in missing])
            result.update({c.id: float(v @ vector) for c, v in zip(missing, embedded, strict=True)})
        return result

    # Indexes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Search:
    """What one search looks in: the same for its first pass and its feedback pass."""

    tenant: str
    names: list[str]
    mode: SearchMode
    pool: int
    allowed: set[int] | None
    lexical: list[LexicalIndex]


def _expansion_terms(search: _Search, query: str, ids: list[int]) -> list[str]:
    """The feedback terms of the chunks `ids`, over all the searched collections."""
    weights: dict[str, float] = {}
    for index in search.lexical:
        for term, weight in index.expansion_terms(query, ids, FEEDBACK_TERMS):
            weights[term] = weights.get(term, 0.0) + weight
    return sorted(weights, key=lambda term: (-weights[term], term))[:FEEDBACK_TERMS]


def _hit(chunk: Chunk, doc: Document, score: float, cosine: float) -> RetrievedChunk:
    return RetrievedChunk(
        document_id=doc.id,
        chunk_id=chunk.id,
        title=doc.title,
        source=doc.source,
        text=chunk.text,
        score=score,
        collection=chunk.collection,
        ordinal=chunk.ordinal,
        section=chunk.section,
        page=chunk.page,
        char_start=chunk.char_start,
        char_end=chunk.char_end,
        version=doc.version,
        ingested_at=doc.ingested_at,
        dense_score=cosine,
    )


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
        created_at=doc.created_at,
        ingested_at=doc.ingested_at,
    )


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
