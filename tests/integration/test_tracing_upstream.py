"""Traces of requests to an upstream model (a scripted OpenAI-compatible server): the
request's span names the upstream that answered (`bastion.upstream`), the engine's time is
`engine.first_token` then `engine.decode` (an upstream cannot split its queue from its
prefill), the token counts are the upstream's, and no span holds the prompt or the answer.
Recorded by the SDK's in-memory exporter on a live server."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import openai
import pytest
from openai import OpenAI
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.integration.test_upstream_models import ScriptedUpstream
from tests.support.local_server import free_port
from tests.support.upstream_front import models_yaml, upstream_front

MODEL_ID = "traced-upstream"
DYING_ID = "dying-upstream"
REFUSING_ID = "refusing-upstream"
# No server listens here: every connection is refused, before any engine span starts.
REFUSING_URL = f"http://127.0.0.1:{free_port()}/v1"
ANSWER = ["The amber ", "lighthouse keeper ", "waves at ", "the ships."]
UPSTREAM_USAGE = (9, len(ANSWER))  # what the scripted upstream reports: prompt, completion


@dataclass
class TracedUpstream:
    client: OpenAI
    api_key: str
    upstream_url: str
    dying_url: str
    exporter: InMemorySpanExporter

    def trace_of(self, request_id: str, timeout_s: float = 10) -> list[ReadableSpan]:
        """Every span of the request's trace, once its server span has ended."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.exporter.get_finished_spans()
            server = next(
                (
                    s
                    for s in spans
                    if s.kind == SpanKind.SERVER
                    and (s.attributes or {}).get("bastion.request_id") == request_id
                ),
                None,
            )
            if server is not None:
                return [s for s in spans if s.context.trace_id == server.context.trace_id]
            time.sleep(0.05)
        raise AssertionError(f"no server span for {request_id}")


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedUpstream]:
    upstream = ScriptedUpstream(ANSWER, dies=False)
    dying = ScriptedUpstream(ANSWER, dies=True)  # drops the connection after the text
    urls = {MODEL_ID: upstream.base_url, DYING_ID: dying.base_url, REFUSING_ID: REFUSING_URL}
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        folder = tmp_path_factory.mktemp("bastion-tracing-upstream")
        with upstream_front(folder, models_yaml(urls), tracer_provider=provider) as front:
            client = OpenAI(
                base_url=f"{front.base_url}/v1", api_key=front.secret, max_retries=0, timeout=30
            )
            yield TracedUpstream(client, front.secret, upstream.base_url, dying.base_url, exporter)
    finally:
        provider.shutdown()
        upstream.close()
        dying.close()


def _named(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


def _every_text(spans: Sequence[ReadableSpan]) -> Iterator[str]:
    """Every string a span carries: its name, status, attributes and events."""
    for span in spans:
        yield span.name
        yield span.status.description or ""
        for attributes in [span.attributes or {}, *(e.attributes or {} for e in span.events)]:
            for key, value in attributes.items():
                yield key
                yield from (str(v) for v in (value if isinstance(value, tuple) else (value,)))


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_request_is_traced_with_its_upstream_and_engine_spans(
    traced: TracedUpstream, stream: bool
) -> None:
    request_id = f"trace-{uuid.uuid4().hex[:12]}"
    phrase = f"the violet heron report {uuid.uuid4().hex[:6]}"
    request = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": f"Summarise {phrase}, please."}],
        "max_tokens": 32,
        "extra_headers": {"x-request-id": request_id},
    }
    if stream:
        chunks = list(traced.client.chat.completions.create(**request, stream=True))  # type: ignore[call-overload]
        answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        answer = traced.client.chat.completions.create(**request).choices[0].message.content  # type: ignore[call-overload]
    assert answer == "".join(ANSWER)

    spans = traced.trace_of(request_id)
    (server,) = (s for s in spans if s.kind == SpanKind.SERVER)
    attributes = server.attributes or {}
    assert attributes["bastion.upstream"] == traced.upstream_url
    assert attributes["gen_ai.request.model"] == MODEL_ID
    usage = (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"])
    assert usage == UPSTREAM_USAGE
    assert attributes["bastion.outcome"] == "ok"

    engine = sorted(
        (s for s in spans if s.name.startswith("engine.")), key=lambda s: s.start_time or 0
    )
    assert [s.name for s in engine] == ["engine.first_token", "engine.decode"]
    first_token, decode = engine
    assert first_token.parent == decode.parent == server.context
    assert first_token.end_time == decode.start_time
    decoded = decode.attributes or {}
    assert decoded["bastion.upstream"] == traced.upstream_url
    assert decoded["gen_ai.usage.output_tokens"] == UPSTREAM_USAGE[1]
    assert decoded["gen_ai.response.finish_reasons"] == ("stop",)

    forbidden = [phrase, "violet heron", "".join(ANSWER), "lighthouse keeper", traced.api_key]
    for text in _every_text(spans):
        for value in forbidden:
            assert value not in text, f"{value!r} in a span: {text!r}"


def test_an_upstream_dying_mid_stream_fails_the_decode_span_and_names_the_upstream(
    traced: TracedUpstream,
) -> None:
    request_id = f"trace-{uuid.uuid4().hex[:12]}"
    # The output checks release the answer's first words as they come, so the failure
    # reaches the client as the stream's error event, after them.
    stream = traced.client.chat.completions.create(
        model=DYING_ID,
        messages=[{"role": "user", "content": "Greet me."}],
        max_tokens=32,
        stream=True,
        extra_headers={"x-request-id": request_id},
    )
    received = []
    with pytest.raises(openai.APIError, match="failed mid-answer"):
        for chunk in stream:
            received += [c.delta.content or "" for c in chunk.choices]
    assert "".join(received), "the first words went out before the upstream died"
    spans = traced.trace_of(request_id)
    (server,) = (s for s in spans if s.kind == SpanKind.SERVER)
    attributes = server.attributes or {}
    assert attributes["bastion.upstream"] == traced.dying_url
    assert attributes["bastion.outcome"] == "error"
    assert attributes["bastion.error_code"] == "upstream_unavailable"
    decode = _named(spans, "engine.decode")
    assert decode.status.status_code == StatusCode.ERROR
    description = decode.status.description or ""
    assert description.isidentifier() and description.endswith("Error")  # a type, no message
    assert (decode.attributes or {})["bastion.upstream"] == traced.dying_url
    assert "gen_ai.response.finish_reasons" not in (decode.attributes or {})


def test_an_upstream_that_refuses_the_connection_is_named_on_the_request_span(
    traced: TracedUpstream,
) -> None:
    request_id = f"trace-{uuid.uuid4().hex[:12]}"
    with pytest.raises(openai.APIStatusError) as caught:
        traced.client.chat.completions.create(
            model=REFUSING_ID,
            messages=[{"role": "user", "content": "Greet me."}],
            max_tokens=8,
            extra_headers={"x-request-id": request_id},
        )
    assert caught.value.status_code == 503
    (server,) = (s for s in traced.trace_of(request_id) if s.kind == SpanKind.SERVER)
    attributes = server.attributes or {}
    assert attributes["bastion.upstream"] == REFUSING_URL
    assert attributes["bastion.error_code"] == "upstream_unavailable"
