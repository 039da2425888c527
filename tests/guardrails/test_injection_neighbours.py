from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from guardrails.injection_classifier import (
    DEFAULT_WEIGHTS,
    NEIGHBOURS_FILE,
    ClassifierWeightsError,
    InjectionClassifier,
)
from guardrails.injection_neighbours import Neighbours, quantised


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _bank(dimension: int = 16) -> tuple[Neighbours, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    attacks, benign = _unit(rng.normal(size=(5, dimension))), _unit(rng.normal(size=(7, dimension)))
    return Neighbours(*quantised(attacks), *quantised(benign), 1.0, 4.0, -4.0, 0.0), attacks, benign


def test_int8_rows_keep_their_direction() -> None:
    rows = _unit(np.random.default_rng(1).normal(size=(50, 384)))
    values, scales = quantised(rows)
    restored = values.astype(np.float32) * scales[:, None]
    assert np.all(np.sum(_unit(restored) * rows, axis=1) > 0.999)


def test_a_text_next_to_an_attack_scores_higher_than_one_next_to_a_harmless_text() -> None:
    bank, attacks, benign = _bank()
    near_attack = _unit(attacks[2:3] + 0.05)
    near_benign = _unit(benign[4:5] + 0.05)
    nearest_attack, nearest_benign = bank.similarities(np.vstack([near_attack, near_benign]))
    assert nearest_attack[0] > 0.95 and nearest_benign[1] > 0.95
    logits = bank.logits(np.zeros(2), np.vstack([near_attack, near_benign]))
    assert logits[0] > 0 > logits[1]
    # The classifier's own logit passes through with its coefficient.
    assert bank.logits(np.array([1.5, 1.5]), np.vstack([near_attack, near_benign]))[0] == (
        pytest.approx(logits[0] + 1.5)
    )


def test_rows_of_different_dimensions_are_refused() -> None:
    attacks, benign = _unit(np.ones((2, 8))), _unit(np.ones((2, 9)))
    with pytest.raises(ValueError, match="dimensions"):
        Neighbours(*quantised(attacks), *quantised(benign), 1.0, 0.0, 0.0, 0.0)


def test_the_shipped_classifier_stacks_its_bank_and_stays_small() -> None:
    classifier = InjectionClassifier.load()
    assert classifier.neighbours is not None
    assert classifier.neighbours.dimension == classifier.dimension
    bank = DEFAULT_WEIGHTS.with_name(NEIGHBOURS_FILE)
    assert bank.stat().st_size < 3_000_000  # ships in git
    # Trained: a training attack pulls the logit up, a harmless text pulls it down.
    assert classifier.neighbours.attack_coef > 0 > classifier.neighbours.benign_coef


def test_a_missing_or_broken_bank_is_named(tmp_path: Path) -> None:
    weights = tmp_path / "weights.json"
    shutil.copy(DEFAULT_WEIGHTS, weights)
    with pytest.raises(ClassifierWeightsError, match=NEIGHBOURS_FILE):
        InjectionClassifier.parse(weights)  # the bank it names is not beside it
    (tmp_path / NEIGHBOURS_FILE).write_bytes(b"not an npz")
    with pytest.raises(ClassifierWeightsError, match=r"weights\.json"):
        InjectionClassifier.parse(weights)
    data = json.loads(DEFAULT_WEIGHTS.read_text(encoding="utf-8"))
    shutil.copy(DEFAULT_WEIGHTS.with_name(NEIGHBOURS_FILE), tmp_path / NEIGHBOURS_FILE)
    del data["neighbours"]["attack"]
    weights.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ClassifierWeightsError, match=r"weights\.json"):
        InjectionClassifier.parse(weights)


def test_saving_writes_the_bank_beside_the_weights(tmp_path: Path) -> None:
    classifier = InjectionClassifier.load()
    weights = tmp_path / "saved.json"
    classifier.save(weights, {"note": "copy"})
    again = InjectionClassifier.parse(weights)
    assert again.neighbours is not None and classifier.neighbours is not None
    assert np.array_equal(again.neighbours.attacks, classifier.neighbours.attacks)
    assert again.neighbours.stack_json() == classifier.neighbours.stack_json()
