from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from retrieval import Embedder
from retrieval.unpadded import MAX_TOKENS, supports_unpadded, unpadded_pass


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
    assert embedder._fits_one_row([0, 1, 2], features)
    with torch.inference_mode():
        pooled, _ = unpadded_pass(embedder._model, features)
    vectors = pooled.numpy()
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    embedder.forget()
    batch, batch_tokens = embedder.embed_with_tokens(texts)
    embedder.forget()
    alone = [embedder.embed_with_tokens([text]) for text in texts]  # one text: padded path
    np.testing.assert_allclose(vectors, np.stack([v[0] for v, _ in alone]), atol=1e-5)
    np.testing.assert_allclose(batch, np.stack([v[0] for v, _ in alone]), atol=1e-5)
    for tokens, (_, alone_tokens) in zip(batch_tokens, alone, strict=True):
        np.testing.assert_allclose(tokens, alone_tokens[0], atol=1e-4)
    # Too many tokens for one row: the padded batch.
    long = ["word " * 200, "another " * 200, "third " * 200]
    long_features = {k: v for k, v in prepare(long).items() if isinstance(v, torch.Tensor)}
    assert not embedder._fits_one_row([0, 1, 2], long_features)
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


def test_threads_asking_for_one_text_at_once_share_one_pass(embedder: Embedder) -> None:
    """A request's guardrails and its retrieval query embed the same text on two threads:
    one computes it, the other waits for that pass."""
    import threading
    import time

    calls: list[list[str]] = []
    forward = embedder._forward
    started, release = threading.Event(), threading.Event()

    def slow_forward(texts: list[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        calls.append(list(texts))
        started.set()
        release.wait(10)
        return forward(texts)

    embedder.forget()
    embedder._forward = slow_forward  # type: ignore[method-assign]
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(embedder.embed_with_tokens, ["shared query text"])
            assert started.wait(10)
            second = pool.submit(embedder.embed, ["shared query text", "guardrail head"])
            # Once the second thread claims its own text, it has found the shared one running.
            while "guardrail head" not in embedder._in_flight:
                time.sleep(0.001)
            release.set()
            (vector, tokens), both = first.result(), second.result()
    finally:
        del embedder._forward
    assert calls == [["shared query text"], ["guardrail head"]]
    np.testing.assert_array_equal(both[0], vector[0])
    assert tokens[0].shape[1] == embedder.dimension
    # The token vectors came with the sentence vector: a later query is a cache hit.
    calls.clear()
    again, again_tokens = embedder.embed_with_tokens(["guardrail head"])
    np.testing.assert_array_equal(again[0], both[1])
    assert again_tokens[0].shape[1] == embedder.dimension


QUESTION = "Où est le Café? Ask the VPN team"


def test_texts_the_tokenizer_reads_alike_share_one_pass(embedder: Embedder) -> None:
    """Retrieval embeds the question as written, the checks a lower-cased copy: MiniLM's
    tokenizer lower-cases and strips accents, so they are one pass and one vector."""
    calls: list[list[str]] = []
    forward = embedder._forward

    def counted(texts: list[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        calls.append(list(texts))
        return forward(texts)

    embedder.forget()
    embedder._forward = counted  # type: ignore[method-assign]
    try:
        written, written_tokens = embedder.embed_with_tokens([QUESTION])
        lowered = embedder.embed(["ou est le cafe? ask the vpn team"])
        both = embedder.embed([QUESTION.upper(), "ou est le cafe ask the vpn team"])
    finally:
        del embedder._forward
    # The last text lost its question mark: other token ids, so a pass of its own.
    assert calls == [[QUESTION], ["ou est le cafe ask the vpn team"]]
    np.testing.assert_array_equal(lowered[0], written[0])
    np.testing.assert_array_equal(both[0], written[0])
    assert not np.array_equal(both[1], written[0])
    assert written_tokens[0].shape[1] == embedder.dimension


def test_without_native_bf16_requests_are_embedded_with_the_same_weights(
    embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 copy for requests would duplicate every weight; it shares the model, its
    tokenizer's lock and nothing else: its cache and threads are its own."""
    monkeypatch.setattr("retrieval.embedder.cpu_has_bf16", lambda: False)
    copy = embedder.for_requests()
    assert copy._model is embedder._model and copy._tokenizing is embedder._tokenizing
    assert copy._cache is not embedder._cache and copy.threads is not None
    embedder.forget()
    copy.forget()
    text = "the requests' embedder and the documents' agree"
    # The same weights, but each embedder its own thread count: a float32 matmul split
    # over other threads sums in another order (1e-7 apart on an AMX Xeon).
    np.testing.assert_allclose(copy.embed([text]), embedder.embed([text]), rtol=1e-5, atol=1e-6)

    # One tokenizer, two embedders on several threads: uncut counting and cut encoding
    # take turns under the shared lock ("Already borrowed" otherwise).
    long = "word " * 400

    def count(i: int) -> int:
        return sum(len(ids) for ids in embedder.token_ids([long, f"text {i}"] * 20))

    def embed(i: int) -> int:
        copy.forget()
        return len(copy.embed([f"sentence {i} {j}" for j in range(3)]))

    with ThreadPoolExecutor(4) as pool:
        results = [
            f.result() for f in [pool.submit(count if i % 2 else embed, i) for i in range(80)]
        ]
    assert results[0] == 3 and results[1] == 20 * (400 + 2)


def test_with_native_bf16_requests_get_a_bfloat16_model_of_their_own(
    embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr("retrieval.embedder.cpu_has_bf16", lambda: True)
    copy = embedder.for_requests()
    assert copy._model is not embedder._model
    assert {p.dtype for p in copy._model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in embedder._model.parameters()} == {torch.float32}
    text = "a bfloat16 copy stays close to the float32 model"
    assert float(copy.embed([text])[0] @ embedder.embed([text])[0]) > 0.99
