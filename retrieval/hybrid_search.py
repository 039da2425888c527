"""The pieces of hybrid search that need no store: rank fusion and metadata filters."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, and_

from retrieval.models import Chunk, Document
from retrieval.results import SearchFilter

RRF_K = 60
"""The usual reciprocal-rank-fusion constant (Cormack et al., 2009)."""
FEEDBACK_CHUNKS = 5
"""How many of the first pass's best chunks expand the query (pseudo-relevance feedback)."""
FEEDBACK_TERMS = 20
"""How many terms of those chunks join the BM25 query, each at half a query term's weight."""
FEEDBACK_BETA = 1.0
"""Weight of the feedback chunks' mean vector added to the query vector (Rocchio)."""


def expand_vector(
    vector: npt.NDArray[np.float32], feedback: npt.NDArray[np.float32], beta: float = FEEDBACK_BETA
) -> npt.NDArray[np.float32]:
    """Rocchio: the query vector moved toward the mean of the `feedback` vectors, unit length."""
    if len(feedback) == 0:
        return vector
    moved: npt.NDArray[np.float32] = vector + beta * feedback.mean(axis=0)
    return (moved / max(float(np.linalg.norm(moved)), 1e-12)).astype(np.float32)


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]], k: int = RRF_K, weights: Sequence[float] | None = None
) -> dict[int, float]:
    """Fuse ranked id lists: each id scores the sum of weight / (k + rank), rank from 1."""
    fused: dict[int, float] = {}
    for position, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[position]
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + weight / (k + rank)
    return fused


def fuse(rankings: list[list[int]]) -> dict[int, float]:
    """Reciprocal rank fusion of several rankings; a single one keeps its order."""
    if len(rankings) > 1:
        return reciprocal_rank_fusion(rankings)
    ranking = rankings[0] if rankings else []
    return {item: float(len(ranking) - rank) for rank, item in enumerate(ranking)}


def fuse_with_reranker(
    rankings: list[list[int]],
    ids: list[int],
    reranked: list[float],
    weight: float | None,
) -> dict[int, float]:
    """The final scores of `ids`: the reranker's own (`weight` None), or its ranking fused
    with the first-stage rankings, worth `weight` of one of them."""
    scores = dict(zip(ids, reranked, strict=True))
    if weight is None:
        return scores
    order = sorted(ids, key=lambda item: (-scores[item], item))
    combined = reciprocal_rank_fusion([*rankings, order], weights=[1.0] * len(rankings) + [weight])
    return {item: combined[item] for item in ids}


def top_ids(scores: dict[int, float], k: int) -> list[int]:
    """The `k` best ids by score, ties broken by the smaller (older) id."""
    return sorted(scores, key=lambda item: (-scores[item], item))[:k]


def filter_conditions(filters: SearchFilter) -> list[ColumnElement[bool]]:
    """SQL conditions on a query joining Chunk and Document that apply `filters`."""
    conditions: list[ColumnElement[bool]] = []
    if filters.document_ids is not None:
        conditions.append(Chunk.document_id.in_(list(filters.document_ids)))
    if filters.source_prefix is not None:
        conditions.append(Document.source.startswith(filters.source_prefix, autoescape=True))
    if filters.kinds is not None:
        conditions.append(Document.kind.in_(list(filters.kinds)))
    if filters.section_prefix is not None:
        conditions.append(Chunk.section.startswith(filters.section_prefix, autoescape=True))
    if filters.pages is not None:
        first, last = filters.pages
        conditions.append(and_(Chunk.page >= first, Chunk.page <= last))
    if filters.ingested_after is not None:
        conditions.append(Document.ingested_at >= filters.ingested_after)
    if filters.ingested_before is not None:
        conditions.append(Document.ingested_at < filters.ingested_before)
    return conditions
