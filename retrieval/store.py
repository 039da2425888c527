"""Ingest documents into per-(tenant, collection) indexes and search them."""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker
from tqdm import tqdm

from retrieval.chunking import chunk_text, title_of
from retrieval.embedder import Embedder
from retrieval.models import Chunk, Document, new_document_id
from retrieval.vector_index import VectorIndex

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown"})
_TITLE_MAX = 512


@dataclass
class IngestResult:
    document_id: str
    chunks: int
    status: Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class RetrievedChunk:
    document_id: str
    chunk_id: int
    title: str
    source: str
    text: str
    score: float


def _check_name(kind: str, value: str) -> None:
    """Tenant and collection names become path parts, so only plain names are allowed."""
    if not _NAME.match(value) or value in {".", ".."}:
        raise ValueError(
            f"invalid {kind} name {value!r}: use 1-128 letters, digits, '_', '.' or '-' "
            "(and not '.' or '..')"
        )


class DocumentStore:
    """Documents and chunks in the database, their vectors in one faiss file per collection.

    The database is the source of truth: a vector whose chunk row is gone is ignored by
    `search`. Open indexes are cached, so use one store per `index_dir` per process.
    """

    def __init__(
        self, session_factory: sessionmaker[Session], embedder: Embedder, index_dir: Path
    ) -> None:
        self._sessions = session_factory
        self._embedder = embedder
        self._index_dir = Path(index_dir)
        self._indexes: dict[tuple[str, str], VectorIndex] = {}
        self._lock = threading.Lock()

    def ingest_text(
        self, tenant: str, collection: str, source: str, text: str, title: str | None = None
    ) -> IngestResult:
        """Add or replace the document at `source`; unchanged content is left alone."""
        _check_name("tenant", tenant)
        _check_name("collection", collection)
        content_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
        with self._sessions() as session:
            doc = session.scalars(
                select(Document).where(
                    Document.tenant == tenant,
                    Document.collection == collection,
                    Document.source == source,
                )
            ).one_or_none()
            if doc is not None and doc.content_hash == content_hash:
                count = session.scalar(
                    select(func.count()).select_from(Chunk).where(Chunk.document_id == doc.id)
                )
                return IngestResult(doc.id, count or 0, "unchanged")

            pieces = chunk_text(text)
            vectors = self._embedder.embed(pieces)
            resolved_title = (title or title_of(text, PurePath(source).name or source))[:_TITLE_MAX]
            status: Literal["created", "updated"]
            stale_ids: list[int] = []
            if doc is None:
                status = "created"
                doc = Document(
                    id=new_document_id(),
                    tenant=tenant,
                    collection=collection,
                    title=resolved_title,
                    source=source,
                    content_hash=content_hash,
                )
                session.add(doc)
                # No ORM relationship orders the inserts, so the parent row goes in first.
                session.flush()
            else:
                status = "updated"
                stale_ids = list(
                    session.scalars(select(Chunk.id).where(Chunk.document_id == doc.id))
                )
                session.execute(delete(Chunk).where(Chunk.document_id == doc.id))
                doc.title = resolved_title
                doc.content_hash = content_hash
            rows = [
                Chunk(
                    document_id=doc.id,
                    tenant=tenant,
                    collection=collection,
                    ordinal=ordinal,
                    text=piece,
                )
                for ordinal, piece in enumerate(pieces)
            ]
            session.add_all(rows)
            session.flush()
            new_ids = np.array([row.id for row in rows], dtype=np.int64)
            self._commit_with_vectors(session, tenant, collection, new_ids, vectors, stale_ids)
            return IngestResult(doc.id, len(rows), status)

    def ingest_paths(
        self, paths: Sequence[Path], tenant: str, collection: str, progress: bool = True
    ) -> list[IngestResult]:
        """Ingest .txt and .md/.markdown files, walking folders recursively."""
        _check_name("tenant", tenant)
        _check_name("collection", collection)
        results: list[IngestResult] = []
        files = _text_files(paths)
        for path in tqdm(files, desc=f"{tenant}/{collection}", unit="file", disable=not progress):
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                logger.warning("skipping %s: not UTF-8 text", path)
                continue
            results.append(self.ingest_text(tenant, collection, str(path), text))
        return results

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
        with self._lock:
            index = self._existing_index(tenant, collection)
            if index is not None and ids:
                index.remove(np.array(ids, dtype=np.int64))
                index.save()
        return True

    def search(
        self,
        tenant: str,
        collections: Sequence[str],
        query: str,
        top_k: int = 4,
        min_score: float = 0.0,
    ) -> list[RetrievedChunk]:
        """The `top_k` chunks of the tenant's `collections` most similar to `query`."""
        _check_name("tenant", tenant)
        names = list(dict.fromkeys(collections))
        for name in names:
            _check_name("collection", name)
        if not names or top_k <= 0 or not query.strip():
            return []
        vector = self._embedder.embed([query])[0]
        scores: dict[int, float] = {}
        with self._lock:
            for name in names:
                index = self._existing_index(tenant, name)
                if index is None:
                    continue
                for chunk_id, score in index.search(vector, top_k):
                    if score >= min_score:
                        scores[chunk_id] = max(score, scores.get(chunk_id, -math.inf))
        if not scores:
            return []
        with self._sessions() as session:
            rows = session.execute(
                select(Chunk, Document)
                .join(Document, Chunk.document_id == Document.id)
                .where(
                    Chunk.id.in_(scores),
                    Chunk.tenant == tenant,
                    Chunk.collection.in_(names),
                )
            ).all()
            found = [
                RetrievedChunk(
                    document_id=doc.id,
                    chunk_id=chunk.id,
                    title=doc.title,
                    source=doc.source,
                    text=chunk.text,
                    score=scores[chunk.id],
                )
                for chunk, doc in rows
            ]
        found.sort(key=lambda hit: (-hit.score, hit.chunk_id))
        return found[:top_k]

    def _commit_with_vectors(
        self,
        session: Session,
        tenant: str,
        collection: str,
        new_ids: np.ndarray,
        vectors: np.ndarray,
        stale_ids: list[int],
    ) -> None:
        """Save the new vectors, then commit; undo the vectors if either step fails."""
        with self._lock:
            index = self._index(tenant, collection)
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

    def _index(self, tenant: str, collection: str) -> VectorIndex:
        """The cached index of (tenant, collection), opened or created. Hold `self._lock`."""
        key = (tenant, collection)
        index = self._indexes.get(key)
        if index is None or index.changed_on_disk:
            index = VectorIndex.open(self._index_path(tenant, collection), self._embedder.dimension)
            self._indexes[key] = index
        return index

    def _existing_index(self, tenant: str, collection: str) -> VectorIndex | None:
        """Like `_index`, but None where nothing was ever saved, so lookups create nothing."""
        if (tenant, collection) in self._indexes or self._index_path(tenant, collection).exists():
            return self._index(tenant, collection)
        return None

    def _index_path(self, tenant: str, collection: str) -> Path:
        return self._index_dir / tenant / f"{collection}.faiss"


def _text_files(paths: Sequence[Path]) -> list[Path]:
    """Resolved, de-duplicated text files under `paths`, in a stable order."""
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
            if candidate.suffix.lower() in _TEXT_SUFFIXES:
                found.setdefault(candidate.resolve(), None)
            else:
                logger.info("skipping %s: only .txt, .md and .markdown are ingested", candidate)
    return list(found)
