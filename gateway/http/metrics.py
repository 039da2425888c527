"""Prometheus metrics for one gateway process, exposed at `/metrics`."""

from __future__ import annotations

import dataclasses
from typing import Any

from litestar import Request, Response, get
from litestar.types import Message, Scope
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from engine import EngineMetrics
from gateway.audit.log import AuditEntry
from gateway.http.drain import Drain
from gateway.http.engine_step_metrics import EngineStepMetrics
from gateway.http.routing_metrics import ModelServerMetrics

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """Counters and histograms of requests, verdicts and the engine, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "bastion_requests_total",
            "Requests by endpoint, status and outcome.",
            ["endpoint", "status", "outcome"],
            registry=self.registry,
        )
        self.responses = Counter(
            "bastion_http_responses_total",
            "HTTP responses of every route, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.verdicts = Counter(
            "bastion_guardrail_verdicts_total",
            "Guardrail verdicts by check and action.",
            ["check", "action"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "bastion_request_seconds",
            "End-to-end request latency.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "bastion_time_to_first_token_seconds",
            "Time to the first streamed token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "bastion_tokens_total",
            "Tokens processed, by kind: prompt, cached_prompt (its prefix-cache hits), completion.",
            ["kind"],
            registry=self.registry,
        )
        self.policy_reload_failures = Gauge(
            "bastion_policy_reload_failures",
            "Policy edits rejected since start.",
            registry=self.registry,
        )
        self.models_reload_failures = Gauge(
            "bastion_models_reload_failures",
            "Models-file edits rejected since start (the last good version kept serving).",
            registry=self.registry,
        )
        # Read from the drain's requests at each scrape: the load an autoscaler follows
        # where there is no engine queue (upstream deployments, deploy/upstream/).
        self.requests_in_flight = Gauge(
            "bastion_requests_in_flight",
            "Model requests being served (chat, completions, embeddings), streams included.",
            registry=self.registry,
        )
        self.engine = Gauge(
            "bastion_engine",
            "Engine state (running, waiting, KV blocks, prefix hit rate...).",
            ["field"],
            registry=self.registry,
        )
        # The same state under vLLM's names, for inference schedulers (llm-d).
        self.model_server = ModelServerMetrics()
        self.registry.register(self.model_server)
        self.engine_steps = EngineStepMetrics()
        self.registry.register(self.engine_steps)

    def observe(self, entry: AuditEntry) -> None:
        self.requests.labels(entry.endpoint, str(entry.status_code), entry.outcome).inc()
        self.latency.labels(entry.endpoint).observe(entry.latency_ms / 1000)
        for verdict in entry.verdicts:
            self.verdicts.labels(verdict.check, verdict.action).inc()
        self.tokens.labels("prompt").inc(entry.prompt_tokens)
        # Beside "prompt", so that cached over prompt is the prefix cache's hit rate.
        self.tokens.labels("cached_prompt").inc(entry.details.get("cached_prompt_tokens", 0))
        self.tokens.labels("completion").inc(entry.completion_tokens)

    def update_engine(self, engine: Any) -> None:
        """Copy the engine's own metrics, when it reports any (the paged engine does)."""
        snapshot = getattr(engine, "metrics", None)
        if snapshot is None:
            return
        values = snapshot()
        if isinstance(values, EngineMetrics):
            self.model_server.update(engine.model_id, values)
            self.engine_steps.update(values.step_seconds)
        if dataclasses.is_dataclass(values):
            # Field by field: `asdict` would deep-copy the step histograms at every scrape.
            for item in dataclasses.fields(values):
                value = getattr(values, item.name)
                if isinstance(value, int | float):
                    self.engine.labels(item.name).set(value)


async def count_response(message: Message, scope: Scope) -> None:
    """`before_send` hook: count every HTTP response (unmatched paths share one label)."""
    if message["type"] != "http.response.start":
        return
    metrics: GatewayMetrics = scope["app"].state.metrics
    route = scope.get("path_template") or "unmatched"
    metrics.responses.labels(route, scope.get("method", ""), str(message["status"])).inc()


@get("/metrics", sync_to_thread=False)
def metrics_endpoint(request: Request[Any, Any, Any]) -> Response[bytes]:
    metrics: GatewayMetrics = request.app.state.metrics
    drain: Drain = request.app.state.drain
    metrics.requests_in_flight.set(drain.model_requests)
    services = request.app.state.get("services")
    if services is not None:
        if services.engine is not None:
            metrics.update_engine(services.engine)
        metrics.policy_reload_failures.set(services.policies.reload_failures)
        metrics.models_reload_failures.set(services.models.reload_failures)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
