"""The classifier's threshold rule: each part's own threshold, and the one that binds."""

from __future__ import annotations

import numpy as np
import pytest

from guardrails.train_injection import (
    GOAL_SOURCE_FPR,
    LANGUAGE_FPR,
    POOLED_FPR,
    SOURCE_FPR,
    Example,
    choose_threshold,
    thresholds_by_rule,
)


def scored(source: str, label: int, scores: list[float]) -> list[tuple[float, Example]]:
    return [(s, Example(f"{source} text {i}", label, source)) for i, s in enumerate(scores)]


def split(rows: list[tuple[float, Example]]) -> tuple[np.ndarray, list[Example]]:
    return np.array([s for s, _ in rows]), [ex for _, ex in rows]


def ladder(count: int, top: float) -> list[float]:
    """`count` scores falling evenly from `top`."""
    return [top * (count - i) / count for i in range(count)]


def test_each_source_allows_its_own_share_of_false_alarms() -> None:
    rows = (
        scored("hard", 0, ladder(200, 0.96))
        + scored("multilingual-es", 0, ladder(300, 0.98))
        + scored("cranfield", 0, ladder(100, 0.7))
        + scored("promptshield", 1, [0.99] * 50)
    )
    probs, examples = split(rows)
    rules = thresholds_by_rule(probs, examples)
    assert set(rules) == {"pooled", "hard", "multilingual-es", "cranfield"}
    hard, language, cranfield = ladder(200, 0.96), ladder(300, 0.98), ladder(100, 0.7)
    # The first score the rule must not reach lies just under the threshold.
    assert rules["hard"] == pytest.approx(hard[int(GOAL_SOURCE_FPR * 200)], abs=1e-5)
    assert rules["multilingual-es"] == pytest.approx(language[int(LANGUAGE_FPR * 300)], abs=1e-5)
    assert rules["cranfield"] == pytest.approx(cranfield[int(SOURCE_FPR * 100)], abs=1e-5)
    pooled = sorted(hard + language + cranfield, reverse=True)
    assert rules["pooled"] == pytest.approx(pooled[int(POOLED_FPR * 600)], abs=1e-5)
    # Attacks set no rule, and the highest rule binds.
    assert choose_threshold(rules) == max(rules.values())
    assert max(rules, key=lambda rule: rules[rule]) == "multilingual-es"
    blocked = [ex for p, ex in rows if p >= choose_threshold(rules) and ex.label == 0]
    by_source = {s: sum(ex.source == s for ex in blocked) for s in ("hard", "multilingual-es")}
    assert by_source["multilingual-es"] <= LANGUAGE_FPR * 300
    assert by_source["hard"] <= GOAL_SOURCE_FPR * 200


def test_the_threshold_stays_between_one_half_and_0_99() -> None:
    quiet, examples = split(scored("cranfield", 0, ladder(100, 0.2)))
    assert max(thresholds_by_rule(quiet, examples).values()) < 0.5
    assert choose_threshold(thresholds_by_rule(quiet, examples)) == 0.5
    loud = np.ones(100)
    assert choose_threshold(thresholds_by_rule(loud, examples)) == 0.99
