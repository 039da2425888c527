"""The embedded engine's step durations as a Prometheus histogram, `bastion_engine_step_seconds`.

The engine keeps the counts itself (engine/step_times.py) and hands them over in its
snapshots, so its thread never touches the registry; this collector exports the latest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from engine.step_times import STEP_SECONDS_BUCKETS, StepHistogram, StepKind


class EngineStepMetrics(Collector):
    """`bastion_engine_step_seconds{kind="decode"|"prefill"}`; nothing before the first
    snapshot (and nothing for an upstream-only deployment)."""

    def __init__(self) -> None:
        self._latest: Mapping[StepKind, StepHistogram] = {}

    def update(self, histograms: Mapping[StepKind, StepHistogram]) -> None:
        self._latest = histograms

    def collect(self) -> Iterator[Metric]:
        if not self._latest:
            return
        family = HistogramMetricFamily(
            "bastion_engine_step_seconds",
            "Duration of the engine's steps: kind=decode for steps of single-token rows "
            "(decodes and their drafts), kind=prefill for steps that also computed prompt "
            "tokens, which every answer decoding beside them waits for.",
            labels=["kind"],
        )
        for kind, histogram in self._latest.items():
            buckets = [
                (_bound(bound), float(count))
                for bound, count in zip(STEP_SECONDS_BUCKETS, histogram.buckets, strict=True)
            ]
            buckets.append(("+Inf", float(histogram.count)))
            family.add_metric([kind], buckets, sum_value=histogram.sum_s)
        yield family


def _bound(seconds: float) -> str:
    return repr(float(seconds))
