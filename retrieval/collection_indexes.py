"""The derived search indexes of each (tenant, collection): faiss vectors and BM25.

Both are rebuilt from the database, the source of truth; see DocumentStore for the order
of writes that keeps them in step with it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from retrieval.embedder import Embedder
from retrieval.lexical import LexicalIndex
from retrieval.models import Chunk
from retrieval.rerank import pack_token_vectors
from retrieval.vector_index import VectorIndex

logger = logging.getLogger(__name__)


class CollectionIndexes:
    """Open faiss and BM25 indexes by (tenant, collection), refreshed when stale.

    Hold `lock` around any use of a VectorIndex it returns.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        embedder: Embedder,
        index_dir: Path,
        approximate_above: int,
    ) -> None:
        self._sessions = session_factory
        self._embedder = embedder
        self._index_dir = index_dir
        self._approximate_above = approximate_above
        self._vectors: dict[tuple[str, str], VectorIndex] = {}
        self._lexical: dict[tuple[str, str], LexicalIndex] = {}
        # The chunks' fingerprint each cached faiss index last caught up with.
        self._synced: dict[tuple[str, str], tuple[int, int | None]] = {}
        self.lock = threading.Lock()

    def rebuild(self, tenant: str, collection: str) -> int:
        """A new faiss file from the database's embeddings; returns its vector count."""
        with self.lock, self._sessions() as session:
            ids, vectors = self.stored_vectors(session, tenant, collection, None)
            session.commit()
            path = self._path(tenant, collection)
            path.unlink(missing_ok=True)
            index = VectorIndex.open(path, self._embedder.dimension, self._approximate_above)
            index.add(ids, vectors)
            index.save()
            self._vectors[(tenant, collection)] = index
            self._synced.pop((tenant, collection), None)
            self._lexical.pop((tenant, collection), None)
            return index.size

    def remove_vectors(self, tenant: str, collection: str, ids: list[int]) -> None:
        """Drop vectors of deleted chunks (already unreachable: `search` joins the database)."""
        with self.lock:
            index = self.existing_vectors(tenant, collection)
            if index is not None and ids:
                index.remove(np.array(ids, dtype=np.int64))
                index.save()

    def lexical(self, session: Session, tenant: str, collection: str) -> LexicalIndex:
        """The collection's BM25 index, rebuilt when its chunks changed since it was built."""
        where = (Chunk.tenant == tenant, Chunk.collection == collection)
        fingerprint = _fingerprint(session, tenant, collection)
        key = (tenant, collection)
        cached = self._lexical.get(key)
        if cached is not None and cached.fingerprint == fingerprint:
            return cached
        rows = session.execute(select(Chunk.id, Chunk.text).where(*where).order_by(Chunk.id)).all()
        index = LexicalIndex([r.id for r in rows], [r.text for r in rows], fingerprint)
        self._lexical[key] = index
        return index

    def stored_vectors(
        self, session: Session, tenant: str, collection: str | None, ids: list[int] | None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Ids and embeddings of chunks from the database; embeds (and stores) missing ones."""
        query = select(Chunk).where(Chunk.tenant == tenant).order_by(Chunk.id)
        if collection is not None:
            query = query.where(Chunk.collection == collection)
        if ids is not None:
            query = query.where(Chunk.id.in_(ids))
        chunks = list(session.scalars(query))
        missing = [c for c in chunks if c.embedding is None]
        if missing:
            vectors, tokens = self._embedder.embed_with_tokens([c.text for c in missing])
            for chunk, vector, token_matrix in zip(missing, vectors, tokens, strict=True):
                chunk.embedding = vector.tobytes()
                chunk.token_vectors = pack_token_vectors(token_matrix)
        matrix = np.zeros((len(chunks), self._embedder.dimension), dtype=np.float32)
        for row, chunk in enumerate(chunks):
            matrix[row] = np.frombuffer(chunk.embedding or b"", dtype=np.float32)
        return np.array([c.id for c in chunks], dtype=np.int64), matrix

    def commit_with_vectors(
        self,
        session: Session,
        tenant: str,
        collection: str,
        new_ids: npt.NDArray[np.int64],
        vectors: npt.NDArray[np.float32],
        stale_ids: list[int],
    ) -> None:
        """Save the new vectors, then commit; undo the vectors if either step fails."""
        with self.lock:
            index = self.vectors(tenant, collection, session, pending=set(new_ids.tolist()))
            try:
                index.add(new_ids, vectors)
                index.save()
                session.commit()
            except BaseException:
                session.rollback()
                index.remove(new_ids)
                try:
                    index.save()
                except OSError:
                    logger.exception("could not save %s after a failed ingest", index.path)
                raise
            if stale_ids:
                # The old chunk rows are gone, so these vectors are already unreachable.
                try:
                    index.remove(np.array(stale_ids, dtype=np.int64))
                    index.save()
                except OSError:
                    logger.exception("could not drop replaced vectors from %s", index.path)

    def vectors(
        self,
        tenant: str,
        collection: str,
        session: Session | None = None,
        pending: set[int] | None = None,
    ) -> VectorIndex:
        """The cached faiss index of (tenant, collection), opened or created. Hold `lock`.

        A freshly read file gets the vectors of committed chunks it lacks (a lost or old
        file), in memory, and so does a cached one once `session` shows that the chunks
        changed: another replica, with its own index file, ingested into the collection.
        Vectors without a chunk may belong to another process's ingest in flight, so they
        stay until `rebuild_index`.
        """
        key = (tenant, collection)
        index = self._vectors.get(key)
        if index is None or index.changed_on_disk:
            index = VectorIndex.open(
                self._path(tenant, collection),
                self._embedder.dimension,
                self._approximate_above,
            )
            if session is None:
                self._add_missing_vectors(index, tenant, collection, None, pending or set())
            self._synced.pop(key, None)
            self._vectors[key] = index
        if session is not None:
            fingerprint = _fingerprint(session, tenant, collection)
            if self._synced.get(key) != fingerprint:
                self._add_missing_vectors(index, tenant, collection, session, pending or set())
                self._synced[key] = fingerprint
        return index

    def _add_missing_vectors(
        self,
        index: VectorIndex,
        tenant: str,
        collection: str,
        session: Session | None,
        pending: set[int],
    ) -> None:
        def add(session: Session) -> None:
            stored = session.scalars(
                select(Chunk.id).where(Chunk.tenant == tenant, Chunk.collection == collection)
            )
            missing = sorted(set(stored) - set(index.ids().tolist()) - pending)
            if missing:
                logger.warning("%s lacks %d vectors; adding them", index.path, len(missing))
                ids, vectors = self.stored_vectors(session, tenant, collection, missing)
                index.add(ids, vectors)

        if session is not None:
            add(session)
        else:
            with self._sessions() as own:
                add(own)
                own.commit()

    def existing_vectors(
        self, tenant: str, collection: str, session: Session | None = None
    ) -> VectorIndex | None:
        """Like `vectors`, but None where the collection has no vectors to search (no file,
        and no chunks as far as `session` shows), so lookups create nothing."""
        if (
            (tenant, collection) in self._vectors
            or self._path(tenant, collection).exists()
            or (session is not None and _fingerprint(session, tenant, collection)[0] > 0)
        ):
            return self.vectors(tenant, collection, session)
        return None

    def _path(self, tenant: str, collection: str) -> Path:
        return self._index_dir / tenant / f"{collection}.faiss"


def _fingerprint(session: Session, tenant: str, collection: str) -> tuple[int, int | None]:
    """The collection's (chunk count, largest chunk id). Chunk ids only grow, so it changes
    with every insert or delete, whichever process made it."""
    where = (Chunk.tenant == tenant, Chunk.collection == collection)
    count, largest = session.execute(select(func.count(), func.max(Chunk.id)).where(*where)).one()
    return int(count), largest
