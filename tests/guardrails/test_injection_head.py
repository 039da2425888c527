"""The injection classifier's token head: its numpy forward against the PyTorch module it
is trained as, seeded training, and the shipped weights file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from guardrails.injection_classifier import (
    DEFAULT_WEIGHTS,
    ClassifierWeightsError,
    InjectionClassifier,
)
from guardrails.injection_head import TokenHead
from guardrails.train_injection_head import _Head, _padded, fit_head


def _token_sets(seed: int, sizes: list[int], dimension: int = 384) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = [rng.normal(size=(n, dimension)).astype(np.float32) for n in sizes]
    return [r / np.linalg.norm(r, axis=1, keepdims=True) for r in rows]


def test_the_numpy_head_computes_what_the_torch_module_does() -> None:
    torch.manual_seed(3)
    module = _Head(384, 16)
    torch.nn.init.normal_(module.out.weight)  # trained weights are not zero
    with torch.no_grad():
        module.scale.fill_(0.7)
        module.out.bias.fill_(-0.4)
    tokens = _token_sets(1, [1, 5, 37])
    linear = np.array([0.5, -2.0, 3.0])
    batch, mask = _padded(tokens)
    with torch.no_grad():
        expected = module(torch.from_numpy(linear.astype(np.float32)), batch, mask).numpy()
    stacked = module.exported()
    np.testing.assert_allclose(stacked.logits(linear, tokens), expected, atol=1e-4)


def test_padding_leaves_a_texts_logit_as_it_is_and_every_token_counts() -> None:
    torch.manual_seed(4)
    module = _Head(384, 8)
    torch.nn.init.normal_(module.out.weight)
    one, longer = _token_sets(2, [3, 11])
    with torch.no_grad():
        alone = float(module(torch.zeros(1), *_padded([one]))[0])
        batched = float(module(torch.zeros(2), *_padded([one, longer]))[0])
    assert batched == pytest.approx(alone, abs=1e-5)
    head = module.exported().head
    assert head.logits([np.concatenate([one, longer])])[0] != pytest.approx(head.logits([one])[0])


def test_training_is_seeded_and_learns_a_token_signal() -> None:
    """Texts holding one marked token are attacks; the linear logits know nothing."""
    tokens = _token_sets(4, [6] * 256)
    marker = _token_sets(5, [1])[0][0]
    labels = np.array([i % 2 for i in range(256)])
    for rows, label in zip(tokens, labels, strict=True):
        if label:
            rows[2] = marker
    weights = np.ones(256)
    first = fit_head(np.zeros(256), tokens, labels, weights)
    again = fit_head(np.zeros(256), tokens, labels, weights)
    np.testing.assert_array_equal(first.head.proj, again.head.proj)
    np.testing.assert_array_equal(first.head.out, again.head.out)
    assert first.bias == again.bias
    logits = first.logits(np.zeros(256), tokens)
    assert np.mean((logits > 0) == (labels == 1)) > 0.9


def test_the_shipped_weights_hold_a_head_and_stay_small() -> None:
    classifier = InjectionClassifier.load()
    assert DEFAULT_WEIGHTS.stat().st_size < 5_000_000  # ships in git
    assert classifier.head.dimension == classifier.dimension == 384
    one, other = _token_sets(6, [4, 9])
    first, second = classifier.head.logits([one, other])
    assert first != pytest.approx(second)  # the head is not a constant


def test_a_weights_file_with_a_bad_head_is_named(tmp_path: Path) -> None:
    data = json.loads(DEFAULT_WEIGHTS.read_text(encoding="utf-8"))
    weights = tmp_path / "headless.json"
    weights.write_text(json.dumps({k: v for k, v in data.items() if k != "token_head"}))
    with pytest.raises(ClassifierWeightsError, match=r"headless\.json"):
        InjectionClassifier.parse(weights)
    data["token_head"]["out"] = data["token_head"]["out"][:-1]
    weights = tmp_path / "misshapen.json"
    weights.write_text(json.dumps(data))
    with pytest.raises(ClassifierWeightsError, match=r"misshapen\.json"):
        InjectionClassifier.parse(weights)


def test_a_head_of_another_dimension_is_refused() -> None:
    with pytest.raises(ValueError, match="shapes"):
        TokenHead(
            np.zeros((384, 8), np.float32),
            np.zeros(8, np.float32),
            np.zeros(8, np.float32),
            np.zeros(8, np.float32),  # should be 16
            0.0,
        )
