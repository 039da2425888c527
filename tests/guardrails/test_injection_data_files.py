"""The hand-written multilingual and persona sources: well formed, sized, and with a test
split that is not a copy of the training split (so their held-out figures mean something)."""

from __future__ import annotations

import json
import re
from collections import Counter
from difflib import SequenceMatcher
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "guardrails" / "data"
KEYS = {"text", "label", "split", "lang", "kind"}
NEAR_COPY = 0.9

# file -> (languages, {(kind, split): minimum per language})
SOURCES: dict[str, tuple[set[str], dict[tuple[str, str], int]]] = {
    "injection_multilingual.jsonl": (
        {"fr", "de", "es", "it", "pt", "nl"},
        {("multilingual_benign", "train"): 80, ("multilingual_benign", "test"): 80},
    ),
    "injection_persona.jsonl": (
        {"en", "fr", "de", "es", "it", "pt"},
        {
            ("persona_attack", "train"): 40,
            ("persona_benign", "train"): 30,
            ("persona_attack", "test"): 30,
            ("persona_benign", "test"): 25,
        },
    ),
}
LABELS = {"multilingual_benign": 0, "persona_benign": 0, "persona_attack": 1}


def _rows(name: str) -> list[dict[str, object]]:
    with (DATA / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _key(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_rows_are_well_formed(name: str) -> None:
    langs, _ = SOURCES[name]
    with (DATA / name).open(encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    for line in lines:
        row = json.loads(line)
        assert set(row) == KEYS, row
        assert isinstance(row["text"], str) and row["text"].strip(), row
        assert row["split"] in ("train", "test"), row
        assert row["lang"] in langs, row
        assert row["kind"] in LABELS and row["label"] == LABELS[row["kind"]], row


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_language_has_enough_rows_per_split(name: str) -> None:
    langs, minimum = SOURCES[name]
    counts = Counter((row["lang"], row["kind"], row["split"]) for row in _rows(name))
    for lang in langs:
        for (kind, split), least in minimum.items():
            assert counts[(lang, kind, split)] >= least, (lang, kind, split)


def test_no_text_is_repeated_in_or_across_files_and_splits() -> None:
    seen = Counter(_key(str(row["text"])) for name in SOURCES for row in _rows(name))
    assert [text for text, n in seen.items() if n > 1] == []


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_no_test_text_is_a_near_copy_of_a_training_text(name: str) -> None:
    rows = _rows(name)
    near: list[tuple[str, str]] = []
    for lang in SOURCES[name][0]:
        train = [_key(str(r["text"])) for r in rows if r["lang"] == lang and r["split"] == "train"]
        for row in rows:
            if row["lang"] != lang or row["split"] != "test":
                continue
            matcher = SequenceMatcher(autojunk=False)
            matcher.set_seq2(_key(str(row["text"])))
            for text in train:
                matcher.set_seq1(text)
                # The cheap upper bounds first: ratio() is only needed for likely copies.
                if (
                    matcher.real_quick_ratio() >= NEAR_COPY
                    and matcher.quick_ratio() >= NEAR_COPY
                    and matcher.ratio() >= NEAR_COPY
                ):
                    near.append((str(row["text"]), text))
    assert near == []
