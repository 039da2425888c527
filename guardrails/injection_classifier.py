"""The trained injection classifier: logistic regression over MiniLM sentence embeddings.

Weights come from `guardrails/train_injection.py` and ship as a small JSON file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

# Takes texts, returns one L2-normalised float32 row per text.
Embedder = Callable[[list[str]], npt.NDArray[np.float32]]

DEFAULT_WEIGHTS = Path(__file__).parent / "data" / "injection_classifier.json"


class ClassifierWeightsError(ValueError):
    """The weights file is missing or malformed; retrain with guardrails/train_injection.py."""


@dataclass(frozen=True, slots=True)
class InjectionClassifier:
    """`probabilities(vectors)` gives P(injection) per embedding row."""

    coef: npt.NDArray[np.float32]
    intercept: float
    threshold: float

    @classmethod
    def load(cls, path: Path = DEFAULT_WEIGHTS) -> InjectionClassifier:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            coef = np.asarray(data["coef"], dtype=np.float32)
            intercept, threshold = float(data["intercept"]), float(data["threshold"])
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise ClassifierWeightsError(f"cannot load classifier weights {path}: {exc}") from exc
        if coef.ndim != 1:
            raise ClassifierWeightsError(f"{path}: coef must be a vector, got shape {coef.shape}")
        return cls(coef, intercept, threshold)

    def save(self, path: Path, metadata: dict[str, object]) -> None:
        data = {
            **metadata,
            "coef": [round(float(x), 6) for x in self.coef],
            "intercept": self.intercept,
            "threshold": self.threshold,
        }
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    def probabilities(self, vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        if vectors.shape[-1] != self.coef.shape[0]:
            raise ValueError(
                f"embedding dimension {vectors.shape[-1]} does not match the classifier's "
                f"{self.coef.shape[0]}: was it trained on another model?"
            )
        logits = vectors.astype(np.float64) @ self.coef.astype(np.float64) + self.intercept
        return 1.0 / (1.0 + np.exp(-logits))


# MiniLM reads at most 256 word pieces, about 1,000 characters of English; longer texts
# are scored window by window and the highest probability counts.
WINDOW_CHARS = 1000
WINDOW_OVERLAP = 200


def text_windows(text: str) -> list[str]:
    """Overlapping windows covering text, cut at spaces where possible."""
    if len(text) <= WINDOW_CHARS:
        return [text]
    windows: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + WINDOW_CHARS, len(text))
        if end < len(text):
            space = text.rfind(" ", start + WINDOW_CHARS // 2, end)
            end = space if space > 0 else end
        windows.append(text[start:end])
        if end >= len(text):
            break
        start = max(end - WINDOW_OVERLAP, start + 1)
    return windows
