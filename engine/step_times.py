"""How long the engine's steps take, by kind, kept as histogram counts for `/metrics`.

A step whose rows are all single tokens (decodes, with their drafts) costs milliseconds; a
step that also computes prompt tokens costs about as much as its prefill chunks (on 2 CPU
cores, 1.6 ms a prompt token: 800 ms for the scheduler's 512), and every answer decoding
beside it waits that long for its next token. The two kinds apart show an operator which
one their latency comes from.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Literal

StepKind = Literal["decode", "prefill"]
STEP_KINDS: tuple[StepKind, ...] = ("decode", "prefill")
# Upper bounds in seconds, from a single CPU decode to prefill steps that stall streams.
STEP_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class StepHistogram:
    """One kind's steps: `buckets[i]` of them took at most `STEP_SECONDS_BUCKETS[i]`
    (cumulative, as Prometheus counts them); `count` and `sum_s` cover every step."""

    buckets: tuple[int, ...]
    count: int
    sum_s: float


class StepTimes:
    """Step durations by kind; written by the engine thread, read through `snapshot`."""

    def __init__(self) -> None:
        self._in_bucket = {kind: [0] * len(STEP_SECONDS_BUCKETS) for kind in STEP_KINDS}
        self._count = dict.fromkeys(STEP_KINDS, 0)
        self._sum_s = dict.fromkeys(STEP_KINDS, 0.0)

    def observe(self, kind: StepKind, seconds: float) -> None:
        index = bisect.bisect_left(STEP_SECONDS_BUCKETS, seconds)
        if index < len(STEP_SECONDS_BUCKETS):
            self._in_bucket[kind][index] += 1
        self._count[kind] += 1
        self._sum_s[kind] += seconds

    def snapshot(self) -> dict[StepKind, StepHistogram]:
        return {
            kind: StepHistogram(
                tuple(itertools.accumulate(self._in_bucket[kind])),
                self._count[kind],
                self._sum_s[kind],
            )
            for kind in STEP_KINDS
        }
