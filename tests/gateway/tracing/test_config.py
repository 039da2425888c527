"""Tracing's configuration from the standard OTEL_* variables, and the provider it builds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.tracing import (
    TracingConfig,
    TracingConfigError,
    build_tracer_provider,
    tracer_provider_from_env,
)
from tests.support.local_server import free_port


@pytest.mark.parametrize(
    ("environ", "exporters"),
    [
        ({}, ()),
        ({"OTEL_TRACES_EXPORTER": "none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": " OTLP , console,otlp"}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "none,console"}, ("console",)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ("otlp",)),
        # An exporter named wins over an endpoint; "none" turns the endpoint's default off.
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ()),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "console"}, ()),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "console"}, ("console",)),
    ],
)
def test_the_exporters_the_variables_name(
    environ: dict[str, str], exporters: tuple[str, ...]
) -> None:
    config = TracingConfig.from_env(environ)
    assert config.exporters == exporters
    assert config.enabled == bool(exporters)


def test_service_name_and_sampler() -> None:
    config = TracingConfig.from_env(
        {
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_SERVICE_NAME": "bastion-eu",
            "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
        }
    )
    assert config.service_name == "bastion-eu"
    assert (config.sampler, config.sampler_ratio) == ("parentbased_traceidratio", 0.25)
    defaults = TracingConfig.from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert (defaults.service_name, defaults.sampler) == ("bastion", "parentbased_always_on")

    provider = build_tracer_provider(config)
    try:
        assert provider.resource.attributes["service.name"] == "bastion-eu"
        assert "TraceIdRatioBased{0.25}" in provider.sampler.get_description()
        assert provider.sampler.get_description().startswith("ParentBased")
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER names jaeger"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL='grpc'",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "sometimes"},
            "OTEL_TRACES_SAMPLER='sometimes'",
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "console",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "1.5",
            },
            "OTEL_TRACES_SAMPLER_ARG='1.5'",
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "console",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "half",
            },
            "OTEL_TRACES_SAMPLER_ARG='half'",
        ),
    ],
)
def test_a_value_tracing_cannot_honour_is_named(environ: dict[str, str], named: str) -> None:
    with pytest.raises(TracingConfigError, match=named.replace("[", r"\[")):
        TracingConfig.from_env(environ)


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each export request's path and body."""

    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def collector() -> Iterator[str]:
    _Collector.received = []
    server = HTTPServer(("127.0.0.1", free_port()), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_otlp_spans_reach_the_endpoint_the_variables_name(
    collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "bastion-otlp-test")
    provider = tracer_provider_from_env()
    assert provider is not None
    with provider.get_tracer("test").start_as_current_span("probe"):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()

    [(path, body)] = _Collector.received
    assert path == "/v1/traces"
    export = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = export.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "bastion-otlp-test"
    assert [s.name for s in resource_spans.scope_spans[0].spans] == ["probe"]


def test_no_provider_without_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert tracer_provider_from_env() is None
