"""Confusion counts for the guardrails benchmarks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counts:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, label: int, predicted: bool) -> None:
        if label and predicted:
            self.tp += 1
        elif label:
            self.fn += 1
        elif predicted:
            self.fp += 1
        else:
            self.tn += 1

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.tp + other.tp, self.fp + other.fp, self.fn + other.fn, self.tn + other.tn
        )

    def row(self, name: str) -> str:
        positives, negatives = self.tp + self.fn, self.fp + self.tn
        precision = ratio(self.tp, self.tp + self.fp)
        recall = ratio(self.tp, positives)
        fpr = ratio(self.fp, negatives)
        return f"| {name} | {positives} | {negatives} | {precision} | {recall} | {fpr} |"


def ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "n/a"
