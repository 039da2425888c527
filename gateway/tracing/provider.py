"""The OpenTelemetry SDK's tracer provider, built from a `TracingConfig`.

The SDK is imported only when tracing is on, so a gateway that traces nothing does not
load it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gateway.tracing.config import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import Sampler


def tracer_provider_from_env() -> TracerProvider | None:
    """The provider the process's `OTEL_*` variables ask for, or None when tracing is off."""
    config = TracingConfig.from_env(os.environ)
    return build_tracer_provider(config) if config.enabled else None


def build_tracer_provider(config: TracingConfig) -> TracerProvider:
    """A provider that batches spans to each of the config's exporters (the OTLP exporter
    reads its endpoint, headers and timeout from the process's OTEL_EXPORTER_OTLP_*)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(
        sampler=_sampler(config),
        resource=Resource.create({SERVICE_NAME: config.service_name}),
        shutdown_on_exit=False,  # the app's lifespan flushes it
    )
    for name in config.exporters:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            # Endpoint, headers, timeout and certificates from OTEL_EXPORTER_OTLP_*.
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return provider


def _sampler(config: TracingConfig) -> Sampler:
    from opentelemetry.sdk.trace import sampling

    root: Sampler = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": sampling.TraceIdRatioBased(config.sampler_ratio),
    }[config.sampler.removeprefix("parentbased_")]
    return sampling.ParentBased(root) if config.sampler.startswith("parentbased_") else root
