"""Hybrid search: BM25 + dense fusion, reranking, filters and cross-process freshness."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from retrieval import (
    Candidate,
    DocumentStore,
    Embedder,
    LateInteractionReranker,
    SearchFilter,
)
from retrieval.hybrid_search import expand_vector, fuse_with_reranker
from retrieval.lexical import LexicalIndex
from retrieval.rerank import max_sim

PARTS = {
    "/kb/pumps.md": "# Pump maintenance\n\nReplace worn pump seals and check the impeller "
    "for cavitation damage during the yearly service.",
    "/kb/valves.md": "# Valve replacement\n\nTo replace a valve, isolate the line, drain it "
    "and fit the new valve with fresh gaskets.",
    "/kb/catalogue.md": "# Spare catalogue\n\nItem QX-7731-B ships from the Leeds depot in "
    "boxes of twelve.",
    "/kb/filters.md": "# Filter service\n\nSwap the intake filter cartridge every six months "
    "and log the pressure drop.",
}


def _ingest(store: DocumentStore, tenant: str = "acme") -> dict[str, str]:
    results = store.ingest_texts(tenant, "kb", list(PARTS.items()))
    return {source: r.document_id for source, r in zip(PARTS, results, strict=True)}


def test_hybrid_finds_an_exact_identifier_that_dense_search_misses(store: DocumentStore) -> None:
    ids = _ingest(store)
    query = "pump seal QX-7731-B"
    dense = store.search("acme", ["kb"], query, top_k=2, mode="dense", rerank=False)
    assert ids["/kb/catalogue.md"] not in {hit.document_id for hit in dense}
    lexical = store.search("acme", ["kb"], query, top_k=1, mode="lexical", rerank=False)
    assert lexical[0].document_id == ids["/kb/catalogue.md"]
    hybrid = store.search("acme", ["kb"], query, top_k=2, rerank=False)
    assert ids["/kb/catalogue.md"] in {hit.document_id for hit in hybrid}
    reranked = store.search("acme", ["kb"], query, top_k=2)
    assert ids["/kb/catalogue.md"] in {hit.document_id for hit in reranked}
    assert all(hit.dense_score is not None for hit in reranked)


def test_reranker_puts_the_answer_before_a_lexically_similar_distractor(
    embedder: Embedder,
) -> None:
    reranker = LateInteractionReranker(embedder)
    query = "How often should the intake filter be replaced?"
    candidates = [
        Candidate(1, "The intake manifold is painted blue; the filter shop is closed."),
        Candidate(2, "Swap the intake filter cartridge every six months."),
        Candidate(3, "Quarterly revenue grew by four percent."),
    ]
    scores = reranker.score(query, candidates)
    assert scores[1] > scores[0] > scores[2]
    stored = embedder.token_embeddings([candidates[1].text])[0]
    precomputed = reranker.score(query, [Candidate(2, candidates[1].text, stored)])
    assert abs(precomputed[0] - scores[1]) < 1e-5


def test_filters_restrict_every_retriever(store: DocumentStore) -> None:
    ids = _ingest(store)
    only_pumps = SearchFilter(document_ids=[ids["/kb/pumps.md"]])
    for mode in ("hybrid", "dense", "lexical"):
        hits = store.search("acme", ["kb"], "valve gaskets", top_k=5, mode=mode, filters=only_pumps)  # type: ignore[arg-type]
        assert {hit.document_id for hit in hits} <= {ids["/kb/pumps.md"]}
    hits = store.search(
        "acme", ["kb"], "service", top_k=5, filters=SearchFilter(source_prefix="/kb/f")
    )
    assert {hit.source for hit in hits} == {"/kb/filters.md"}
    hits = store.search(
        "acme", ["kb"], "service", top_k=5, filters=SearchFilter(section_prefix="Pump")
    )
    assert {hit.section for hit in hits} == {"Pump maintenance"}


def test_min_score_gates_on_cosine_in_every_mode(store: DocumentStore) -> None:
    _ingest(store)
    for mode in ("hybrid", "dense", "lexical"):
        hits = store.search("acme", ["kb"], "QX-7731-B", top_k=4, min_score=0.99, mode=mode)  # type: ignore[arg-type]
        assert hits == []


def test_bm25_sees_changes_made_by_another_process(
    session_factory: sessionmaker[Session], embedder: Embedder, index_dir: Path
) -> None:
    server = DocumentStore(session_factory, embedder, index_dir)
    cli = DocumentStore(session_factory, embedder, index_dir)
    ids = _ingest(cli)
    assert server.search("acme", ["kb"], "QX-7731-B", mode="lexical", rerank=False)
    cli.ingest_text("acme", "kb", "/kb/new.md", "Gizmo ZZ-990 is discontinued.")
    hits = server.search("acme", ["kb"], "ZZ-990", mode="lexical", rerank=False)
    assert [hit.source for hit in hits] == ["/kb/new.md"]
    cli.delete_document("acme", ids["/kb/catalogue.md"])
    assert server.search("acme", ["kb"], "QX-7731-B", mode="lexical", rerank=False) == []


def test_max_sim_over_many_documents_at_once_equals_one_at_a_time() -> None:
    rng = np.random.default_rng(0)
    query = rng.standard_normal((7, 16)).astype(np.float32)
    documents = [rng.standard_normal((n, 16)).astype(np.float32) for n in (3, 0, 12, 1)]
    expected = [float((query @ d.T).max(axis=1).mean()) if len(d) else 0.0 for d in documents]
    assert np.allclose(max_sim(query, documents), expected, atol=1e-5)
    assert max_sim(query[:0], documents).tolist() == [0.0] * 4


def test_reranker_ranking_is_final_or_fused_by_its_weight() -> None:
    first_stage = [[1, 2, 3], [1, 3, 2]]
    reranked = [0.1, 0.9, 0.5]  # for ids 1, 2, 3: the reranker prefers 2
    final = fuse_with_reranker(first_stage, [1, 2, 3], reranked, None)
    assert max(final, key=final.__getitem__) == 2
    # Half a vote cannot overrule two first-stage rankings that agree on the top.
    fused = fuse_with_reranker(first_stage, [1, 2, 3], reranked, 0.5)
    assert sorted(fused, key=lambda i: -fused[i]) == [1, 2, 3]


def test_feedback_terms_come_from_the_best_hits_and_not_the_query() -> None:
    index = LexicalIndex(
        [1, 2, 3],
        ["turbine blade flutter", "flutter of a turbine blade at resonance", "pump seals"],
        fingerprint=None,
    )
    terms = [term for term, _ in index.expansion_terms("blade flutter", [1, 2], 5)]
    assert set(terms) == {"turbine", "resonance"}
    found = index.search("resonance", 3)
    expanded = index.search("resonance", 3, expansion=["turbine"])
    assert [i for i, _ in found] == [2] and [i for i, _ in expanded][:2] == [2, 1]


def test_feedback_finds_a_related_chunk_that_shares_no_query_word(store: DocumentStore) -> None:
    store.ingest_texts(
        "acme",
        "kb",
        [
            ("/kb/a.md", "Compressor surge: the compressor stalls and airflow reverses."),
            ("/kb/b.md", "Airflow reverses when a compressor stalls near its peak."),
            ("/kb/c.md", "The cafeteria opens at noon."),
        ],
    )
    query = "surge"
    plain = store.search("acme", ["kb"], query, top_k=3, mode="lexical", feedback=False)
    assert [hit.source for hit in plain] == ["/kb/a.md"]
    expanded = store.search("acme", ["kb"], query, top_k=3, mode="lexical", feedback=True)
    assert [hit.source for hit in expanded][:2] == ["/kb/a.md", "/kb/b.md"]
    assert "/kb/c.md" not in {hit.source for hit in expanded}


def test_expanded_vector_moves_toward_the_feedback_and_stays_unit() -> None:
    query = np.array([1.0, 0.0, 0.0], np.float32)
    moved = expand_vector(query, np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], np.float32))
    assert np.isclose(np.linalg.norm(moved), 1.0) and moved[1] > 0 and moved[0] > 0
    assert expand_vector(query, np.zeros((0, 3), np.float32)) is query
