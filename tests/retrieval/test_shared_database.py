"""Two stores on one database, each with its own index folder, as two replicas run: dense
search on one finds what the other ingested, whether its faiss index was open or not."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from retrieval import DocumentStore, Embedder

CANTEEN = "# Canteen\n\nThe canteen on the ground floor serves lunch from 11:30 to 14:00."
KAYAKS = "# Kayak racks\n\nStaff who paddle to work may keep a kayak on the racks behind C."
QUESTION = "Where do I leave my boat when I come to the office by water?"


def dense(store: DocumentStore, tenant: str = "acme") -> list[str]:
    hits = store.search(tenant, ["handbook"], QUESTION, top_k=2, mode="dense", feedback=False)
    return [hit.document_id for hit in hits]


def test_a_replica_finds_what_another_ingested_with_its_index_open_or_not(
    session_factory: sessionmaker[Session], embedder: Embedder, tmp_path: Path
) -> None:
    a = DocumentStore(session_factory, embedder, tmp_path / "a")
    b = DocumentStore(session_factory, embedder, tmp_path / "b")
    never_opened = DocumentStore(session_factory, embedder, tmp_path / "c")
    b.ingest_text("acme", "handbook", "/canteen.md", CANTEEN)
    assert len(dense(b)) == 1  # b's index is open now

    kayaks = a.ingest_text("acme", "handbook", "/kayaks.md", KAYAKS).document_id

    assert dense(b)[0] == kayaks
    assert dense(never_opened)[0] == kayaks
    assert dense(never_opened, "other") == []
    assert not (tmp_path / "c").exists()  # lookups create no files
