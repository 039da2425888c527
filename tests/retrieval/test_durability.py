"""A crash at any step of ingestion leaves the old document or the new one, never a mix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from retrieval import Chunk, DocumentStore, Embedder, VectorIndex

OLD = "# Office\n\nThe cafeteria serves sushi on Fridays."
NEW = "# Office\n\nThe parking garage closes at ten pm."


class Crash(BaseException):
    """Stands in for the process dying: nothing after it runs, no cleanup code either."""


def _raise(*_args: object, **_kwargs: object) -> None:
    raise Crash


def _die_at_commit(patch: pytest.MonkeyPatch, after: bool) -> None:
    """Crash just before or just after the database commit; once dead, nothing else runs."""
    real_commit, real_remove = Session.commit, VectorIndex.remove
    dead = False

    def commit(self: Session) -> None:
        nonlocal dead
        if after:
            real_commit(self)
        dead = True
        raise Crash

    def remove(self: VectorIndex, ids: np.ndarray) -> int:
        if dead:
            raise Crash
        return real_remove(self, ids)

    patch.setattr(Session, "commit", commit)
    patch.setattr(VectorIndex, "remove", remove)


def _index_ids(index_dir: Path) -> set[int]:
    return set(VectorIndex.open(index_dir / "acme" / "facilities.faiss", dim=384).ids().tolist())


def _db_ids(factory: sessionmaker[Session]) -> set[int]:
    with factory() as session:
        return set(session.scalars(select(Chunk.id)))


def _texts(store: DocumentStore) -> list[str]:
    # Lexical search for both versions' words, dense for the rest: every retriever is checked.
    found = []
    for mode in ("dense", "lexical", "hybrid"):
        for query in ("cafeteria sushi", "parking garage"):
            found += [
                h.text
                for h in store.search("acme", ["facilities"], query, 5, -1.0, mode=mode)  # type: ignore[arg-type]
            ]
    return sorted(set(found))


@pytest.mark.parametrize(
    ("crash_point", "survivor"),
    [
        ("before_index_save", OLD),  # vectors added in memory only
        ("before_commit", OLD),  # new vectors saved, database not committed
        ("before_stale_vectors_removed", NEW),  # committed, old vectors still in the file
    ],
)
def test_crash_mid_update_leaves_one_consistent_version(
    session_factory: sessionmaker[Session],
    embedder: Embedder,
    index_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    crash_point: str,
    survivor: str,
) -> None:
    store = DocumentStore(session_factory, embedder, index_dir)
    store.ingest_text("acme", "facilities", "/f/office.md", OLD)
    with monkeypatch.context() as patch:
        if crash_point == "before_index_save":
            patch.setattr(VectorIndex, "save", _raise)
        else:
            _die_at_commit(patch, after=crash_point == "before_stale_vectors_removed")
        with pytest.raises(Crash):
            store.ingest_text("acme", "facilities", "/f/office.md", NEW)

    # A restarted process sees exactly one version, whatever the faiss file holds.
    restarted = DocumentStore(session_factory, embedder, index_dir)
    assert _texts(restarted) == [survivor]
    # No chunk without a vector; extra vectors (of the version that lost) are allowed.
    assert _db_ids(session_factory) <= _index_ids(index_dir)
    restarted.rebuild_index("acme", "facilities")
    assert _index_ids(index_dir) == _db_ids(session_factory)
    assert _texts(restarted) == [survivor]


def test_lost_index_file_is_rebuilt_from_stored_embeddings(
    store: DocumentStore,
    session_factory: sessionmaker[Session],
    embedder: Embedder,
    index_dir: Path,
) -> None:
    store.ingest_text("acme", "facilities", "/f/office.md", OLD)
    (index_dir / "acme" / "facilities.faiss").unlink()
    restarted = DocumentStore(session_factory, embedder, index_dir)
    assert restarted.rebuild_index("acme", "facilities") == 1
    hits = restarted.search("acme", ["facilities"], "What food is served?", mode="dense")
    assert [hit.text for hit in hits] == [OLD]
    # Chunks stored without an embedding (before revision 0002) are embedded again.
    with session_factory() as session:
        for chunk in session.scalars(select(Chunk)):
            chunk.embedding = None
        session.commit()
    assert restarted.rebuild_index("acme", "facilities") == 1
    with session_factory() as session:
        stored = session.scalars(select(Chunk.embedding)).one()
    assert stored is not None and np.frombuffer(stored, np.float32).shape == (384,)
