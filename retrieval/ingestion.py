"""Deciding what an ingestion batch changes, and writing its document and chunk rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePath

import numpy as np
import numpy.typing as npt
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from retrieval.chunking import TextChunk
from retrieval.loaders import ParsedDocument
from retrieval.models import Chunk, Document, new_document_id
from retrieval.rerank import pack_token_vectors
from retrieval.results import IngestResult, IngestStatus

_TITLE_MAX = 512
_SECTION_MAX = 512


@dataclass(frozen=True, slots=True)
class PendingDocument:
    """A parsed document waiting to be stored under `source`."""

    source: str
    parsed: ParsedDocument
    content_hash: str
    title: str | None = None


@dataclass(frozen=True, slots=True)
class _Ref:
    """An input whose result is that of input `position` (as a duplicate, or not)."""

    position: int
    duplicate: bool


@dataclass
class IngestionPlan:
    """Per input document: a finished result (unchanged, duplicate), the index of the row
    to write for it, or a reference to another input's result."""

    tenant: str
    collection: str
    slots: list[IngestResult | int | _Ref] = field(default_factory=list)
    to_write: list[PendingDocument] = field(default_factory=list)
    existing: dict[int, Document] = field(default_factory=dict)

    def write(
        self,
        session: Session,
        pieces: Sequence[Sequence[TextChunk]],
        vectors: npt.NDArray[np.float32],
        token_vectors: Sequence[npt.NDArray[np.float32]],
    ) -> tuple[npt.NDArray[np.int64], list[int]]:
        """Create or update the documents and replace their chunks; flushes, never commits.

        Returns the new chunk ids (in `vectors` order) and the ids of the chunks replaced.
        """
        now = datetime.now(UTC)
        docs: list[Document] = []
        stale: list[int] = []
        for position, item in enumerate(self.to_write):
            doc = self.existing.get(position)
            fallback = PurePath(item.source).name or item.source
            title = (item.title or item.parsed.title or fallback)[:_TITLE_MAX]
            if doc is None:
                doc = Document(
                    id=new_document_id(),
                    tenant=self.tenant,
                    collection=self.collection,
                    source=item.source,
                    version=1,
                    created_at=now,
                )
                session.add(doc)
            else:
                stale.extend(session.scalars(select(Chunk.id).where(Chunk.document_id == doc.id)))
                session.execute(delete(Chunk).where(Chunk.document_id == doc.id))
                doc.version += 1
            doc.title, doc.content_hash, doc.kind = title, item.content_hash, item.parsed.kind
            doc.ingested_at = now
            docs.append(doc)
        # No ORM relationship orders the inserts, so the parent rows go in first.
        session.flush()
        rows: list[Chunk] = []
        for doc, chunks in zip(docs, pieces, strict=True):
            for ordinal, piece in enumerate(chunks):
                row = len(rows)
                rows.append(
                    Chunk(
                        document_id=doc.id,
                        tenant=self.tenant,
                        collection=self.collection,
                        ordinal=ordinal,
                        text=piece.text,
                        page=piece.page,
                        char_start=piece.start,
                        char_end=piece.end,
                        section=piece.section[:_SECTION_MAX] if piece.section else None,
                        embedding=np.ascontiguousarray(vectors[row], np.float32).tobytes(),
                        token_vectors=pack_token_vectors(token_vectors[row]),
                    )
                )
        session.add_all(rows)
        session.flush()
        for index, slot in enumerate(self.slots):
            if isinstance(slot, int):
                doc, chunks = docs[slot], pieces[slot]
                status: IngestStatus = "created" if doc.version == 1 else "updated"
                self.slots[index] = IngestResult(doc.id, len(chunks), status, doc.version)
        return np.array([row.id for row in rows], dtype=np.int64), stale

    def results(self) -> list[IngestResult]:
        """One result per input document, in input order (call after `write`)."""
        results: list[IngestResult] = []
        for slot in self.slots:
            while isinstance(slot, _Ref):
                target = self.slots[slot.position]
                if isinstance(target, IngestResult) and slot.duplicate:
                    target = IngestResult(
                        target.document_id, target.chunks, "duplicate", target.version
                    )
                slot = target
            if not isinstance(slot, IngestResult):
                raise RuntimeError("IngestionPlan.results called before write")
            results.append(slot)
        return results


def plan_ingestion(
    session: Session, tenant: str, collection: str, items: Sequence[PendingDocument]
) -> IngestionPlan:
    """Sort `items` into unchanged (same source, same content), duplicate (same content
    under another source) and to-write; the last of several items with one source wins."""
    plan = IngestionPlan(tenant, collection)
    sources = [item.source for item in items]
    hashes = [item.content_hash for item in items]
    in_collection = (Document.tenant == tenant, Document.collection == collection)
    by_source = {
        d.source: d
        for d in session.scalars(
            select(Document).where(*in_collection, Document.source.in_(sources))
        )
    }
    by_hash = {
        d.content_hash: d
        for d in session.scalars(
            select(Document).where(*in_collection, Document.content_hash.in_(hashes))
        )
    }
    last_of_source = {item.source: position for position, item in enumerate(items)}
    first_of_hash: dict[str, int] = {}
    for position, item in enumerate(items):
        doc = by_source.get(item.source)
        twin = by_hash.get(item.content_hash)
        slot: IngestResult | int | _Ref
        if last_of_source[item.source] != position:
            slot = _Ref(last_of_source[item.source], duplicate=False)
        elif doc is not None and doc.content_hash == item.content_hash:
            slot = IngestResult(doc.id, chunk_count(session, doc.id), "unchanged", doc.version)
        elif doc is None and twin is not None:
            slot = IngestResult(twin.id, chunk_count(session, twin.id), "duplicate", twin.version)
        elif doc is None and item.content_hash in first_of_hash:
            slot = _Ref(first_of_hash[item.content_hash], duplicate=True)
        else:
            first_of_hash.setdefault(item.content_hash, position)
            if doc is not None:
                plan.existing[len(plan.to_write)] = doc
            slot = len(plan.to_write)
            plan.to_write.append(item)
        plan.slots.append(slot)
    return plan


def chunk_count(session: Session, document_id: str) -> int:
    """How many chunks the document has."""
    count = session.scalar(
        select(func.count()).select_from(Chunk).where(Chunk.document_id == document_id)
    )
    return count or 0
