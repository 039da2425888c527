"""OpenTelemetry traces of the request path: one server span per request, a child span
per stage. Off unless the `OTEL_*` variables ask for an exporter (`config.py`)."""

from gateway.tracing.config import TracingConfig, TracingConfigError
from gateway.tracing.engine_spans import traced_deltas
from gateway.tracing.middleware import trace_requests
from gateway.tracing.provider import build_tracer_provider, tracer_provider_from_env
from gateway.tracing.stages import (
    describe_auth,
    describe_entry,
    describe_retrieval,
    describe_verdicts,
    embedding_stage,
    in_span,
    note_policy,
    stage,
    trace_check,
)

__all__ = [
    "TracingConfig",
    "TracingConfigError",
    "build_tracer_provider",
    "describe_auth",
    "describe_entry",
    "describe_retrieval",
    "describe_verdicts",
    "embedding_stage",
    "in_span",
    "note_policy",
    "stage",
    "trace_check",
    "trace_requests",
    "traced_deltas",
    "tracer_provider_from_env",
]
