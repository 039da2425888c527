from __future__ import annotations

import numpy as np

from retrieval import Embedder
from retrieval.unpadded import MAX_TOKENS, supports_unpadded, unpadded_sentence_vectors


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


def test_a_short_batch_is_computed_unpadded_with_the_vectors_each_text_gets_alone(
    embedder: Embedder,
) -> None:
    import torch

    texts = [
        "Please summarise the attached notes for the quarterly finance review, " * 3,
        "request 12-7.",
        "Reach me at maria.lopez@example.com if anything is unclear.",
    ]
    prepare = getattr(embedder._model, "preprocess", None) or embedder._model.tokenize
    features = {k: v for k, v in prepare(texts).items() if isinstance(v, torch.Tensor)}
    assert supports_unpadded(embedder._model)
    assert embedder._fits_one_row([0, 1, 2], features, with_tokens=False)
    with torch.inference_mode():
        vectors = unpadded_sentence_vectors(embedder._model, features).numpy()
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    embedder.forget()
    batch = embedder.embed(texts)
    embedder.forget()
    alone = np.stack([embedder.embed([text])[0] for text in texts])  # one text: padded path
    np.testing.assert_allclose(vectors, alone, atol=1e-5)
    np.testing.assert_allclose(batch, alone, atol=1e-5)
    # Too many tokens for one row: the padded batch.
    long = ["word " * 200, "another " * 200, "third " * 200]
    long_features = {k: v for k, v in prepare(long).items() if isinstance(v, torch.Tensor)}
    assert not embedder._fits_one_row([0, 1, 2], long_features, with_tokens=False)
    assert int(long_features["attention_mask"].sum()) > MAX_TOKENS
