"""The injection classifier's memory of its training texts: how close a text's MiniLM
sentence vector comes to the nearest training attack and to the nearest harmless training
text, stacked on the linear model and token head's logit.

Attacks come in families (one template with another payload, one jailbreak retold), and a
linear model draws one boundary through all of them; a new member of a family sits next
to its relatives whatever side of that boundary it falls on. The nearest harmless text
pulls the other way: a security handout that discusses an attack is nearer to other
handouts than to the attack. The bank holds every training attack of the original sources
(not the generated obfuscations) and a sample of the harmless texts, as int8 rows with one
scale each; the stack is a logistic regression over (logit, nearest attack, nearest
harmless text), fitted by `guardrails/train_injection.py` on out-of-fold values.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Rows = npt.NDArray[np.float32]


def quantised(rows: Rows) -> tuple[npt.NDArray[np.int8], Rows]:
    """Rows as int8 with one float32 scale each (cosine to the float rows above 0.999)."""
    scales = np.maximum(np.abs(rows).max(axis=1), 1e-12) / 127.0
    return np.round(rows / scales[:, None]).astype(np.int8), scales.astype(np.float32)


@dataclass(frozen=True, slots=True)
class Neighbours:
    """logit = logit_coef * logit + attack_coef * (cosine to the nearest training attack)
    + benign_coef * (cosine to the nearest harmless training text) + intercept."""

    attacks: npt.NDArray[np.int8]  # (attacks, dimension)
    attack_scales: Rows
    benign: npt.NDArray[np.int8]  # (harmless texts, dimension)
    benign_scales: Rows
    logit_coef: float
    attack_coef: float
    benign_coef: float
    intercept: float
    # The rows as unit float32 vectors, for the products.
    _attack_rows: Rows = field(init=False, repr=False, compare=False)
    _benign_rows: Rows = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, rows, scales in (
            ("attack", self.attacks, self.attack_scales),
            ("harmless", self.benign, self.benign_scales),
        ):
            if rows.ndim != 2 or len(rows) == 0 or scales.shape != (len(rows),):
                raise ValueError(f"{name} rows of shape {rows.shape} with {scales.shape} scales")
        if self.attacks.shape[1] != self.benign.shape[1]:
            raise ValueError("attack and harmless rows of different dimensions")
        object.__setattr__(self, "_attack_rows", _unit_rows(self.attacks, self.attack_scales))
        object.__setattr__(self, "_benign_rows", _unit_rows(self.benign, self.benign_scales))

    @property
    def dimension(self) -> int:
        return int(self.attacks.shape[1])

    def similarities(self, vectors: Rows) -> tuple[Rows, Rows]:
        """Cosine of each (unit) vector to the nearest attack and nearest harmless row."""
        vectors = np.asarray(vectors, dtype=np.float32)
        return (
            (vectors @ self._attack_rows.T).max(axis=1),
            (vectors @ self._benign_rows.T).max(axis=1),
        )

    def logits(self, logits: npt.NDArray[np.float64], vectors: Rows) -> npt.NDArray[np.float64]:
        """The stacked logit of texts whose classifier logits and sentence vectors these are."""
        attack, benign = self.similarities(vectors)
        return np.asarray(
            self.logit_coef * logits
            + self.attack_coef * attack.astype(np.float64)
            + self.benign_coef * benign.astype(np.float64)
            + self.intercept,
            dtype=np.float64,
        )

    def save(self, path: Path) -> None:
        np.savez_compressed(
            path,
            attacks=self.attacks,
            attack_scales=self.attack_scales,
            benign=self.benign,
            benign_scales=self.benign_scales,
        )

    def stack_json(self) -> dict[str, float]:
        return {
            "logit": round(self.logit_coef, 6),
            "attack": round(self.attack_coef, 6),
            "benign": round(self.benign_coef, 6),
            "intercept": round(self.intercept, 6),
        }

    @classmethod
    def load(cls, path: Path, stack: dict[str, Any]) -> Neighbours:
        """The bank in `path` with the stack's coefficients (`stack_json`); raises
        OSError, KeyError, TypeError or ValueError on a missing or malformed one."""
        try:
            with np.load(path) as bank:
                attacks = np.asarray(bank["attacks"], dtype=np.int8)
                attack_scales = np.asarray(bank["attack_scales"], dtype=np.float32)
                benign = np.asarray(bank["benign"], dtype=np.int8)
                benign_scales = np.asarray(bank["benign_scales"], dtype=np.float32)
        except zipfile.BadZipFile as exc:  # np.load's error for a damaged archive
            raise ValueError(f"{path}: {exc}") from exc
        return cls(
            attacks,
            attack_scales,
            benign,
            benign_scales,
            float(stack["logit"]),
            float(stack["attack"]),
            float(stack["benign"]),
            float(stack["intercept"]),
        )


def _unit_rows(rows: npt.NDArray[np.int8], scales: Rows) -> Rows:
    floats = rows.astype(np.float32) * scales[:, None]
    return np.ascontiguousarray(
        floats / np.maximum(np.linalg.norm(floats, axis=1, keepdims=True), 1e-12)
    )
