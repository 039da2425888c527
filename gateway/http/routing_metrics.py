"""The engine's load under the names an inference scheduler reads from a model server.

The Gateway API Inference Extension's endpoint picker (llm-d's scheduler) scrapes each
model server's `/metrics` for its queue, running requests and KV-cache use, under vLLM's
names unless told otherwise (its model-server protocol, docs/deploy.md). So an embedded-
engine replica exports them too, with vLLM's `model_name` label, beside `bastion_engine`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from engine import EngineMetrics


class ModelServerMetrics(Collector):
    """vLLM-named gauges and counters of the last engine snapshot; none before the first."""

    def __init__(self) -> None:
        self._latest: tuple[str, EngineMetrics] | None = None

    def update(self, model_name: str, metrics: EngineMetrics) -> None:
        self._latest = (model_name, metrics)

    def collect(self) -> Iterator[Metric]:
        if self._latest is None:
            return
        model, m = self._latest
        labels = [model]
        usage = m.kv_blocks_used / m.kv_blocks_total if m.kv_blocks_total else 0.0
        gauges = (
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", m.waiting),
            ("vllm:num_requests_running", "Requests in the running batch.", m.running),
            ("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", usage),
            # The same, under vLLM's older name, the endpoint picker's
            # default before its v1.3 (`--kv-cache-usage-percentage-metric`).
            ("vllm:gpu_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", usage),
        )
        for name, documentation, value in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
            gauge.add_metric(labels, value)
            yield gauge
        counters = (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in prompt tokens looked up.",
                m.prefix_cache_queried_tokens,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in prompt tokens found cached.",
                m.prefix_cache_hit_tokens,
            ),
        )
        for name, documentation, value in counters:
            counter = CounterMetricFamily(name, documentation, labels=["model_name"])
            counter.add_metric(labels, value)
            yield counter
