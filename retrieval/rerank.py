"""Rerankers: late interaction over MiniLM token vectors, or a local cross-encoder folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from retrieval.embedder import Embedder


@dataclass(frozen=True, slots=True)
class Candidate:
    """A chunk to rerank; `token_vectors` are the ones stored at ingestion, if any."""

    chunk_id: int
    text: str
    token_vectors: npt.NDArray[np.float32] | None = None


class Reranker(Protocol):
    """Scores candidates for a query; higher is more relevant. One score per candidate.

    `query_tokens` are the query's token vectors (`Embedder.embed_with_tokens`) when the
    caller has them already; rerankers that have no use for them ignore them.
    `fusion_weight` None makes the reranker's order final; a number fuses its ranking with
    the first-stage rankings (reciprocal rank fusion), worth that many of them.
    """

    fusion_weight: float | None

    def score(
        self,
        query: str,
        candidates: Sequence[Candidate],
        query_tokens: npt.NDArray[np.float32] | None = None,
    ) -> list[float]: ...


class LateInteractionReranker:
    """ColBERT-style MaxSim: each query token's best cosine against the chunk's tokens, averaged.

    Uses the token vectors stored with each chunk, so only the query passes through the model
    (and not even that when the caller passes its token vectors).
    """

    # Alone it ranks no better than dense search on Cranfield, so its ranking joins the
    # first-stage ones as half a vote rather than replacing them (docs/benchmarks.md).
    fusion_weight: float | None = 0.5

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder

    def score(
        self,
        query: str,
        candidates: Sequence[Candidate],
        query_tokens: npt.NDArray[np.float32] | None = None,
    ) -> list[float]:
        if not candidates:
            return []
        if query_tokens is None:
            query_tokens = self._embedder.token_embeddings([query])[0]
        missing = [c.text for c in candidates if c.token_vectors is None]
        computed = iter(self._embedder.token_embeddings(missing))
        documents = [
            c.token_vectors if c.token_vectors is not None else next(computed) for c in candidates
        ]
        scores: list[float] = max_sim(query_tokens, documents).tolist()
        return scores


def max_sim(
    query_tokens: npt.NDArray[np.float32], documents: Sequence[npt.NDArray[np.float32]]
) -> npt.NDArray[np.float32]:
    """Late-interaction scores of `documents` (token matrices) for the query's tokens.

    One matrix product over all documents' tokens at once: a product per document costs
    more in BLAS calls (and thread wake-ups) than in arithmetic.
    """
    scores = np.zeros(len(documents), dtype=np.float32)
    filled = [i for i, tokens in enumerate(documents) if len(tokens)]
    if not filled or len(query_tokens) == 0:
        return scores
    tokens = np.concatenate([documents[i] for i in filled]).astype(np.float32, copy=False)
    similarity = tokens @ np.asarray(query_tokens, dtype=np.float32).T
    starts = np.cumsum([0] + [len(documents[i]) for i in filled[:-1]])
    scores[filled] = np.maximum.reduceat(similarity, starts, axis=0).mean(axis=1)
    return scores


class CrossEncoderReranker:
    """A sentence-transformers cross-encoder read from a local folder (never from a hub)."""

    fusion_weight: float | None = None

    def __init__(self, model_path: Path, batch_size: int = 32) -> None:
        if not (model_path / "config.json").is_file():
            raise FileNotFoundError(f"no cross-encoder model at {model_path}")
        from sentence_transformers import CrossEncoder

        self._model = CrossEncoder(str(model_path), device="cpu", local_files_only=True)
        self._batch_size = batch_size

    def score(
        self,
        query: str,
        candidates: Sequence[Candidate],
        query_tokens: npt.NDArray[np.float32] | None = None,
    ) -> list[float]:
        if not candidates:
            return []
        pairs = [(query, candidate.text) for candidate in candidates]
        scores = self._model.predict(pairs, batch_size=self._batch_size, show_progress_bar=False)
        return [float(s) for s in np.asarray(scores).reshape(-1)]


def load_reranker(embedder: Embedder, model_path: Path | None = None) -> Reranker:
    """A cross-encoder from `model_path` when given, else late interaction over `embedder`."""
    if model_path is not None:
        return CrossEncoderReranker(model_path)
    return LateInteractionReranker(embedder)


def pack_token_vectors(matrix: npt.NDArray[np.float32]) -> bytes:
    """Row-wise int8 quantisation of unit vectors: a quarter of the float32 size."""
    matrix = np.asarray(matrix, dtype=np.float32)
    scales: npt.NDArray[np.float32] = (
        np.maximum(np.abs(matrix).max(axis=1, initial=0.0), 1e-8) / 127.0
    )
    codes = np.round(matrix / scales[:, None]).astype(np.int8)
    header = np.array(matrix.shape, dtype=np.int32).tobytes()
    return header + scales.astype(np.float16).tobytes() + codes.tobytes()


def unpack_token_vectors(blob: bytes) -> npt.NDArray[np.float32]:
    rows, dim = (int(v) for v in np.frombuffer(blob, dtype=np.int32, count=2))
    scales = np.frombuffer(blob, dtype=np.float16, count=rows, offset=8).astype(np.float32)
    codes = np.frombuffer(blob, dtype=np.int8, count=rows * dim, offset=8 + 2 * rows)
    return codes.reshape(rows, dim).astype(np.float32) * scales[:, None]
