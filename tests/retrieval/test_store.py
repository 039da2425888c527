from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from retrieval import Chunk, Document, DocumentStore, Embedder, VectorIndex

VACATION = (
    "# Vacation policy\n\nFull-time employees accrue 25 days of paid annual leave per year. "
    "Leave requests must be approved by your manager two weeks in advance. Up to five unused "
    "days can be carried over into the next calendar year."
)
EXPENSES = (
    "# Expense reports\n\nSubmit receipts for business travel, client meals and equipment "
    "purchases within 30 days. Finance reimburses approved reports with the next monthly "
    "salary payment."
)
VPN = (
    "# VPN setup\n\nInstall the WireGuard client, import the configuration file from the IT "
    "portal and connect before using internal systems from home. Contact the helpdesk if the "
    "tunnel does not come up."
)


def _ingest_handbook(store: DocumentStore, tenant: str = "acme") -> dict[str, str]:
    ids = {}
    for name, text in {"vacation": VACATION, "expenses": EXPENSES, "vpn": VPN}.items():
        result = store.ingest_text(tenant, "handbook", f"/docs/{name}.md", text)
        assert result.status == "created"
        assert result.chunks == 1
        ids[name] = result.document_id
    return ids


def _count(factory: sessionmaker[Session], model: type[Document] | type[Chunk]) -> int:
    with factory() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("How many days off do I get each year?", "vacation"),
        ("How do I get my money back for a dinner with a customer?", "expenses"),
        ("How can I reach the company network when working remotely?", "vpn"),
    ],
)
def test_search_finds_the_document_for_a_paraphrased_question(
    store: DocumentStore, question: str, expected: str
) -> None:
    ids = _ingest_handbook(store)
    hits = store.search("acme", ["handbook"], question, top_k=3)
    assert hits[0].document_id == ids[expected]
    assert hits[0].source == f"/docs/{expected}.md"
    assert hits[0].title != ""
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)


def test_top_k_and_min_score_limit_results(store: DocumentStore) -> None:
    _ingest_handbook(store)
    assert len(store.search("acme", ["handbook"], "annual leave", top_k=2)) == 2
    assert store.search("acme", ["handbook"], "annual leave", min_score=0.99) == []
    assert store.search("acme", ["handbook"], "annual leave", top_k=0) == []


def test_title_comes_from_heading_or_argument(store: DocumentStore) -> None:
    store.ingest_text("acme", "notes", "/n/a.txt", "Plain text without heading.")
    store.ingest_text("acme", "notes", "/n/b.md", VPN, title="Remote access")
    titles = {hit.source: hit.title for hit in store.search("acme", ["notes"], "text", 5, -1.0)}
    assert titles == {"/n/a.txt": "a.txt", "/n/b.md": "Remote access"}
    assert store.search("acme", ["handbook"], "x") == []


def test_reingest_unchanged_and_updated(
    store: DocumentStore, session_factory: sessionmaker[Session], index_dir: Path
) -> None:
    first = store.ingest_text("acme", "facilities", "/f/office.md", "The cafeteria serves sushi.")
    again = store.ingest_text("acme", "facilities", "/f/office.md", "The cafeteria serves sushi.")
    assert again.status == "unchanged"
    assert again.document_id == first.document_id
    assert again.chunks == first.chunks == 1

    updated = store.ingest_text(
        "acme", "facilities", "/f/office.md", "The parking garage closes at ten pm."
    )
    assert updated.status == "updated"
    assert updated.document_id == first.document_id
    assert _count(session_factory, Document) == 1
    assert _count(session_factory, Chunk) == 1

    hits = store.search("acme", ["facilities"], "What food does the cafeteria serve?", top_k=5)
    assert [hit.text for hit in hits] == ["The parking garage closes at ten pm."]
    # The replaced vector is gone from the saved index, not just hidden by the database.
    assert VectorIndex.open(index_dir / "acme" / "facilities.faiss", dim=384).size == 1


def test_failed_index_save_rolls_back_the_database(
    session_factory: sessionmaker[Session], embedder: Embedder, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("", encoding="utf-8")
    store = DocumentStore(session_factory, embedder, blocker)
    with pytest.raises(OSError):
        store.ingest_text("acme", "handbook", "/docs/vpn.md", VPN)
    assert _count(session_factory, Document) == 0
    assert _count(session_factory, Chunk) == 0


def test_delete_removes_document_chunks_and_vectors(
    store: DocumentStore, session_factory: sessionmaker[Session]
) -> None:
    ids = _ingest_handbook(store)
    assert store.delete_document("acme", ids["vpn"]) is True
    hits = store.search("acme", ["handbook"], "How do I set up the VPN?", top_k=5)
    assert ids["vpn"] not in {hit.document_id for hit in hits}
    assert len(hits) == 2
    assert _count(session_factory, Document) == 2
    assert _count(session_factory, Chunk) == 2
    assert store.delete_document("acme", ids["vpn"]) is False


def test_tenants_are_isolated(store: DocumentStore) -> None:
    acme = _ingest_handbook(store, tenant="acme")
    globex = store.ingest_text("globex", "handbook", "/docs/vpn.md", "Globex uses OpenVPN.")

    hits = store.search("globex", ["handbook"], "How many vacation days do I get?", top_k=10)
    assert {hit.document_id for hit in hits} == {globex.document_id}
    assert store.search("initech", ["handbook"], "vacation days") == []
    assert store.delete_document("globex", acme["vacation"]) is False
    assert acme["vacation"] in {
        hit.document_id for hit in store.search("acme", ["handbook"], "vacation", top_k=10)
    }


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", ".", "", "x" * 129, "tab\tname"])
def test_bad_names_raise_value_error(store: DocumentStore, index_dir: Path, name: str) -> None:
    with pytest.raises(ValueError, match="invalid collection name"):
        store.ingest_text("acme", name, "/s.md", "text")
    with pytest.raises(ValueError, match="invalid collection name"):
        store.search("acme", ["ok", name], "text")
    with pytest.raises(ValueError, match="invalid tenant name"):
        store.ingest_text(name, "handbook", "/s.md", "text")
    assert not index_dir.exists()


def test_index_persists_across_store_instances(
    store: DocumentStore,
    session_factory: sessionmaker[Session],
    embedder: Embedder,
    index_dir: Path,
) -> None:
    ids = _ingest_handbook(store)
    assert sorted(p.name for p in (index_dir / "acme").iterdir()) == ["handbook.faiss"]

    fresh = DocumentStore(session_factory, embedder, index_dir)
    hits = fresh.search("acme", ["handbook"], "Which VPN client should I install?", top_k=1)
    assert [hit.document_id for hit in hits] == [ids["vpn"]]


def test_ingest_paths_walks_folders_and_skips_other_files(
    store: DocumentStore, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    (docs / "it").mkdir(parents=True)
    (docs / "vacation.md").write_text(VACATION, encoding="utf-8")
    (docs / "it" / "vpn.markdown").write_text(VPN, encoding="utf-8")
    (docs / "expenses.txt").write_text(EXPENSES, encoding="utf-8")
    (docs / "logo.png").write_bytes(b"\x89PNG")

    results = store.ingest_paths([docs, docs / "expenses.txt"], "acme", "handbook", progress=False)
    assert [result.status for result in results] == ["created"] * 3

    hits = store.search("acme", ["handbook"], "connecting to the office network from home")
    assert hits[0].source == str((docs / "it" / "vpn.markdown").resolve())
    assert hits[0].title == "VPN setup"

    again = store.ingest_paths([docs], "acme", "handbook", progress=False)
    assert [result.status for result in again] == ["unchanged"] * 3
    with pytest.raises(FileNotFoundError):
        store.ingest_paths([tmp_path / "missing"], "acme", "handbook", progress=False)


def test_update_bumps_version_and_old_text_is_never_found_again(store: DocumentStore) -> None:
    first = store.ingest_text("acme", "kb", "/kb/door.md", "Door code is 4471-ALPHA.")
    second = store.ingest_text("acme", "kb", "/kb/door.md", "Door code is 9902-BRAVO.")
    assert (first.version, second.version, second.status) == (1, 2, "updated")
    for mode in ("hybrid", "dense", "lexical"):
        hits = store.search("acme", ["kb"], "4471-ALPHA door code", 5, -1.0, mode=mode)  # type: ignore[arg-type]
        assert [(h.text, h.version) for h in hits] == [("Door code is 9902-BRAVO.", 2)]
    assert store.delete_document("acme", second.document_id)
    for mode in ("hybrid", "dense", "lexical"):
        assert store.search("acme", ["kb"], "9902-BRAVO door code", 5, -1.0, mode=mode) == []  # type: ignore[arg-type]
    assert store.get_document("acme", second.document_id) is None


def test_tenants_never_see_each_others_chunks_in_any_mode(store: DocumentStore) -> None:
    store.ingest_text("acme", "kb", "/kb/secret.md", "Acme launch codeword is PELICAN-42.")
    store.ingest_text("globex", "kb", "/kb/other.md", "Globex picnic is in June.")
    for mode in ("hybrid", "dense", "lexical"):
        hits = store.search("globex", ["kb"], "PELICAN-42 launch codeword", 5, -1.0, mode=mode)  # type: ignore[arg-type]
        assert {h.source for h in hits} <= {"/kb/other.md"}
    assert store.list_documents("globex") == store.list_documents("globex", "kb")
    assert [d.source for d in store.list_documents("globex")] == ["/kb/other.md"]
    acme_id = store.list_documents("acme")[0].id
    assert store.get_document("globex", acme_id) is None


def test_same_content_under_another_source_is_a_duplicate(store: DocumentStore) -> None:
    original = store.ingest_text("acme", "kb", "/kb/a.md", VPN)
    results = store.ingest_texts(
        "acme", "kb", [("/kb/b.md", VPN), ("/kb/c.md", EXPENSES), ("/kb/d.md", EXPENSES)]
    )
    assert [r.status for r in results] == ["duplicate", "created", "duplicate"]
    assert results[0].document_id == original.document_id
    assert results[2].document_id == results[1].document_id
    assert [d.source for d in store.list_documents("acme", "kb")] == ["/kb/a.md", "/kb/c.md"]
    # Another collection of the same tenant is separate.
    assert store.ingest_text("acme", "other", "/kb/b.md", VPN).status == "created"


def test_a_reduced_precision_query_embedder_ranks_like_the_document_one(
    session_factory: sessionmaker[Session], index_dir: Path, embedder: Embedder
) -> None:
    """The gateway embeds queries with the bf16 copy; the documents keep float32."""
    exact = DocumentStore(session_factory, embedder, index_dir)
    _ingest_handbook(exact)
    fast = DocumentStore(
        session_factory, embedder, index_dir, query_embedder=embedder.for_requests()
    )
    for question in (
        "How many vacation days do I get?",
        "When are travel receipts reimbursed?",
        "How do I connect to internal systems from home?",
    ):
        for rerank in (False, True):
            expected = exact.search("acme", ["handbook"], question, top_k=3, rerank=rerank)
            found = fast.search("acme", ["handbook"], question, top_k=3, rerank=rerank)
            assert [c.chunk_id for c in found] == [c.chunk_id for c in expected]
            for a, b in zip(found, expected, strict=True):
                assert a.score == pytest.approx(b.score, abs=0.01)
