"""The query side of a DocumentStore: the chunks of a tenant's collections that best answer
a query, by dense and lexical retrieval, pseudo-relevance feedback and reranking."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.orm import Session, defer, sessionmaker

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
from retrieval.lexical import LexicalIndex
from retrieval.models import Chunk, Document
from retrieval.names import check_name
from retrieval.rerank import Candidate, Reranker, unpack_token_vectors
from retrieval.results import RetrievedChunk, SearchFilter, SearchMode

# Filters matching at most this many chunks are searched exactly from stored embeddings.
_EXACT_FILTERED_MAX = 20_000


class ChunkSearch:
    """Searches the chunks a DocumentStore keeps; vectors of chunks that are not (or no
    longer) in the database are ignored."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        embedder: Embedder,
        query_embedder: Embedder,
        reranker: Reranker,
        indexes: CollectionIndexes,
    ) -> None:
        self._sessions = session_factory
        self._embedder = embedder
        self._query_embedder = query_embedder
        self._reranker = reranker
        self._indexes = indexes

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
        check_name("tenant", tenant)
        names = list(dict.fromkeys(collections))
        for name in names:
            check_name("collection", name)
        if not names or top_k <= 0 or not query.strip():
            return []
        pool = max(candidates, top_k)
        query_tokens: npt.NDArray[np.float32] | None = None
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
        vector: npt.NDArray[np.float32],
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

    def _embeddings(self, session: Session, tenant: str, ids: list[int]) -> npt.NDArray[np.float32]:
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
        vector: npt.NDArray[np.float32],
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

    def _cosines(
        self, vector: npt.NDArray[np.float32], chunks: Sequence[Chunk]
    ) -> dict[int, float]:
        stored = [c for c in chunks if c.embedding is not None]
        missing = [c for c in chunks if c.embedding is None]
        result = {
            c.id: float(np.frombuffer(c.embedding or b"", np.float32) @ vector) for c in stored
        }
        if missing:
            embedded = self._embedder.embed([c.text for c in missing])
            result.update({c.id: float(v @ vector) for c, v in zip(missing, embedded, strict=True)})
        return result


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
