"""Fit the injection classifier's neighbours (`guardrails/injection_neighbours.py`): which
training texts the bank keeps, their out-of-fold similarities, and the stack fitted on
them; `guardrails/train_injection.py` calls these once per cross-validation fold and once
on the whole training split.

The bank holds every training attack but the generated obfuscations (rewrites of the
others, which would leave a rewrite's original its nearest neighbour out of fold) and a
sample of NEIGHBOUR_BENIGN harmless texts, not units. Out-of-fold recall at the threshold
rule, on one set of fold fits, before WRITTEN_APART: 0.862 without the stack; with the
nearest attack 0.875; with the nearest harmless text too 0.895 (all 12,000 of them), 0.888
(3,000), 0.893 (1,500); the mean of the three nearest for the nearest 0.887; 2,000 lies
between the two samples. With near-copies (cosine above 0.98 to the scored text) left out
of the bank, and the three nearest as well, 0.893: the gain is not from copies of the
scored text. With WRITTEN_APART, 0.875 (threshold 0.880, against 0.854 without it). With
WRITTEN_APART, on the fold fits of another run (0.869 at 2,000 there: a recipe's
out-of-fold recall moves by about a point between runs): 1,000 harmless texts 0.869, 4,000
0.870, all 12,000 0.878 (a 5.6 MB bank); the three nearest as well 0.864.
Character 3-6-gram neighbours beside MiniLM's (TF-IDF cosine, the same bank rule), on
another run's fold fits: 0.8629 against 0.8706; the n-grams already reach the classifier.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from guardrails.injection_neighbours import Neighbours, quantised

NEIGHBOUR_BENIGN = 2000
NEIGHBOUR_EXCLUDED = ("obfuscated", "units")
# Sources written by hand, each in a few sittings: a row's nearest neighbour is a sibling
# written in the same sitting, and the held-out rows were written apart. Out of fold, a
# row of these sources is scored against a bank without its own source, as the held-out
# rows meet a bank without their siblings; the shipped bank keeps them. Without this, out
# of fold put each language's harmless requests at or under 0.8% at threshold 0.854, and
# held out the Italian ones read 2.4% (see docs/benchmarks.md for the selection).
WRITTEN_APART = ("multilingual-", "persona-")

Vectors = npt.NDArray[np.float32]
# (logit, nearest attack, nearest harmless text) coefficients and the intercept.
Stack = tuple[tuple[float, float, float], float]
_IDENTITY: Stack = ((1.0, 0.0, 0.0), 0.0)


def bank(
    sentences: Vectors,
    sources: Sequence[str],
    labels: npt.NDArray[np.int_],
    rows: npt.NDArray[np.intp],
    stack: Stack = _IDENTITY,
    leave_out: str = "",
) -> Neighbours:
    """The bank of `rows` (attacks, and a sample of NEIGHBOUR_BENIGN harmless texts), none
    of source `leave_out`, with `stack`'s coefficients (the identity's similarities are
    what the stack is fitted on)."""
    kept = [i for i in rows if sources[i] not in NEIGHBOUR_EXCLUDED and sources[i] != leave_out]
    attacks = [i for i in kept if labels[i] == 1]
    benign = [i for i in kept if labels[i] == 0]
    if len(benign) > NEIGHBOUR_BENIGN:
        chosen = np.random.default_rng(0).choice(len(benign), NEIGHBOUR_BENIGN, replace=False)
        benign = [benign[j] for j in sorted(chosen)]
    (logit, attack, harmless), intercept = stack
    return Neighbours(
        *quantised(sentences[attacks]),
        *quantised(sentences[benign]),
        logit,
        attack,
        harmless,
        intercept,
    )


def held_similarities(
    sentences: Vectors,
    sources: Sequence[str],
    labels: npt.NDArray[np.int_],
    fit_rows: npt.NDArray[np.intp],
    held_rows: npt.NDArray[np.intp],
) -> npt.NDArray[np.float64]:
    """(nearest attack, nearest harmless text) of each held row, against the bank of the
    fit rows; a row of a WRITTEN_APART source against that bank without its source."""
    by_leave_out: dict[str, list[int]] = defaultdict(list)
    for i in held_rows:
        by_leave_out[sources[i] if sources[i].startswith(WRITTEN_APART) else ""].append(int(i))
    similarities = np.zeros((len(sources), 2))
    for leave_out, rows in by_leave_out.items():
        fold_bank = bank(sentences, sources, labels, fit_rows, leave_out=leave_out)
        similarities[rows] = np.column_stack(fold_bank.similarities(sentences[rows]))
    return similarities[held_rows]


def fit_stack(
    logits: npt.NDArray[np.float64],
    similarities: npt.NDArray[np.float64],
    y: npt.NDArray[np.int_],
    weights: npt.NDArray[np.float64],
) -> tuple[Stack, npt.NDArray[np.float64]]:
    """The stack over (logit, nearest attack, nearest harmless text), fitted on out-of-fold
    values of all rows, and its own out-of-fold probabilities (a second cross-validation),
    which choose the threshold."""
    design = np.column_stack([logits, similarities])
    stacked = np.zeros(len(y))
    for fit_rows, held_rows in StratifiedKFold(5, shuffle=True, random_state=3).split(design, y):
        fold = LogisticRegression(max_iter=2000)
        fold.fit(design[fit_rows], y[fit_rows], sample_weight=weights[fit_rows])
        stacked[held_rows] = fold.predict_proba(design[held_rows])[:, 1]
    model = LogisticRegression(max_iter=2000).fit(design, y, sample_weight=weights)
    logit, attack, harmless = (float(c) for c in model.coef_[0])
    return ((logit, attack, harmless), float(model.intercept_[0])), stacked
