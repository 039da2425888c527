from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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


def test_token_ids_are_the_models_without_special_tokens_and_uncut(embedder: Embedder) -> None:
    long = " ".join(["word"] * (embedder.max_tokens + 10))
    short, uncut = embedder.token_ids(["Hello, World!", long])
    assert embedder.max_tokens == 256
    assert len(uncut) == embedder.max_tokens + 10
    assert embedder.decode(short) == "hello, world!"  # uncased WordPiece
    cls_id, sep_id = 101, 102
    assert embedder.decode([cls_id, *short, sep_id]) == "hello, world!"
    assert all(0 <= i < embedder.vocabulary_size for i in short)


def test_counting_tokens_beside_embedding_from_other_threads(embedder: Embedder) -> None:
    """The fast tokenizer raises "Already borrowed" when one thread changes its truncation
    while another encodes; `token_ids` (uncut) and `embed` (cut) take turns."""
    long = "word " * 400

    def count(i: int) -> int:
        return sum(len(ids) for ids in embedder.token_ids([long, f"text {i}"] * 20))

    def embed(i: int) -> int:
        embedder.forget()  # so that every call tokenizes
        return len(embedder.embed([f"sentence {i} {j}" for j in range(3)]))

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(count if i % 2 else embed, i) for i in range(120)]
        results = [future.result() for future in futures]
    assert results[0] == 3 and results[1] == 20 * (400 + 2)
