from __future__ import annotations

import numpy as np

from retrieval import Embedder


def test_embed_shape_dtype_and_normalisation(embedder: Embedder) -> None:
    vectors = embedder.embed(["hello world", "a second sentence", "third"])
    assert embedder.dimension == 384
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_empty_input_gives_zero_rows(embedder: Embedder) -> None:
    vectors = embedder.embed([])
    assert vectors.shape == (0, 384)
    assert vectors.dtype == np.float32


def test_similar_texts_score_higher_and_call_matches_embed(embedder: Embedder) -> None:
    texts = ["How do I reset my password?", "I forgot my login password", "The cat sat on a mat"]
    vectors = embedder(texts)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    np.testing.assert_allclose(vectors, embedder.embed(texts), atol=1e-5)
