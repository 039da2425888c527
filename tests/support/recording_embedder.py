"""Embedders for tests and benches of the injection check: one that records what the
checks ask the real embedder for, one that fails, and one of zero vectors that needs no model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from guardrails.embedding import TokenEmbedder

Rows = npt.NDArray[np.float32]


class RecordingEmbedder:
    """`embedder`, recording each batch asked of it (sentence vectors or with tokens)."""

    def __init__(self, embedder: TokenEmbedder) -> None:
        self._embedder = embedder
        self.batches: list[list[str]] = []

    @property
    def asked(self) -> list[str]:
        return [text for batch in self.batches for text in batch]

    def clear(self) -> None:
        self.batches.clear()

    def __call__(self, texts: list[str]) -> Rows:
        self.batches.append(list(texts))
        return np.asarray(self._embedder(texts), dtype=np.float32)

    def embed_with_tokens(self, texts: Sequence[str]) -> tuple[Rows, list[Rows]]:
        self.batches.append(list(texts))
        return self._embedder.embed_with_tokens(texts)


class ZeroEmbedder(RecordingEmbedder):
    """Zero vectors of MiniLM's size, one token each, recorded; no model."""

    def __init__(self, dimension: int = 384) -> None:
        super().__init__(self)
        self._dimension = dimension

    def __call__(self, texts: list[str]) -> Rows:
        self.batches.append(list(texts))
        return np.zeros((len(texts), self._dimension), dtype=np.float32)

    def embed_with_tokens(self, texts: Sequence[str]) -> tuple[Rows, list[Rows]]:
        self.batches.append(list(texts))
        zeros = np.zeros((len(texts), self._dimension), dtype=np.float32)
        return zeros, [np.zeros((1, self._dimension), dtype=np.float32) for _ in texts]


class BrokenEmbedder:
    """Raises `error` whatever it is asked."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    def __call__(self, texts: list[str]) -> Rows:
        raise self._error

    def embed_with_tokens(self, texts: Sequence[str]) -> tuple[Rows, list[Rows]]:
        raise self._error
