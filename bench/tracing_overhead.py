"""What tracing costs a request, through the HTTP API: the same services served by an app
with tracing off, a second one (the control) and one exporting OTLP to a receiver in this
process, asked the same requests in turn.

    flock /tmp/bench.lock .venv/bin/python bench/tracing_overhead.py
    .venv/bin/python bench/tracing_overhead.py --rounds 5 --no-write

One set of services (engine, embedder, analyzer, database on a fresh data folder) behind
three uvicorn servers on threads, as `tests/integration/test_tracing.py` does it, so that
every side has the very same engine and models: *off* and *control* without a tracer
provider, *on* with the provider `OTEL_TRACES_EXPORTER=otlp` builds (the SDK's batch
processor, its defaults) sending to an OTLP/HTTP receiver on a thread. *control* against
*off* is the difference two identical sides show, the floor under which *on* against
*off* means nothing. For each kind of request (`GET /v1/models`: the server span and
`auth` alone; `POST /v1/embeddings`, one short input: the input checks' and the
embedding's spans; `POST /v1/chat/completions`, not streamed, greedy, 8 tokens: every
stage's), each round sends the same request to the three in an order that rotates.
Medians of the client's wall time (and of chat's `x-bastion-overhead-ms`), the ratio
on/off, and the median over rounds of each side's difference from *off*. The receiver
decodes every export and counts its spans, so the run shows that tracing was on.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from doc_section import write_section  # noqa: E402  (bench/ is on the path)
from load import QUESTIONS  # noqa: E402

from gateway.keys.store import create_key  # noqa: E402
from gateway.services import load_services  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.tracing import TracingConfig, build_tracer_provider  # noqa: E402
from tests.support.local_server import free_port, serve_in_thread  # noqa: E402

WARM_UP = 5  # requests of each kind to each server before any is timed


class SpanReceiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 that counts the spans it is sent."""

    def __init__(self) -> None:
        self.spans = 0
        self.exports = 0
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                request = ExportTraceServiceRequest.FromString(body)
                count = sum(
                    len(scope.spans)
                    for resource in request.resource_spans
                    for scope in resource.scope_spans
                )
                with lock:
                    receiver.spans += count
                    receiver.exports += 1
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: one line a batch would bury the bench's output."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in this process's environment for the block."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


Ask = Callable[[httpx.Client, int], httpx.Response]


def ask_models(client: httpx.Client, n: int) -> httpx.Response:
    return client.get("/v1/models")


def ask_embedding(client: httpx.Client, n: int) -> httpx.Response:
    return client.post("/v1/embeddings", json={"input": QUESTIONS[n % len(QUESTIONS)]})


def ask_chat(client: httpx.Client, n: int) -> httpx.Response:
    body = {
        "messages": [{"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]}],
        "max_tokens": 8,
        "temperature": 0,
    }
    return client.post("/v1/chat/completions", json=body)


KINDS: tuple[tuple[str, Ask, float], ...] = (
    # name, request, share of --rounds (the cheap ones get more, their medians are noisier)
    ("`GET /v1/models`", ask_models, 4.0),
    ("`POST /v1/embeddings`, one input", ask_embedding, 3.0),
    ("`POST /v1/chat/completions`, 8 tokens", ask_chat, 1.0),
)


@dataclass
class Timings:
    wall_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)  # x-bastion-overhead-ms, chat


def timed(client: httpx.Client, ask: Ask, n: int, into: Timings) -> None:
    started = time.perf_counter()
    response = ask(client, n)
    into.wall_ms.append((time.perf_counter() - started) * 1000)
    response.raise_for_status()
    if "x-bastion-overhead-ms" in response.headers:
        into.overhead_ms.append(float(response.headers["x-bastion-overhead-ms"]))


SIDES = ("off", "control", "on")  # control: a second untraced app, the noise floor


def compare(clients: Mapping[str, httpx.Client], ask: Ask, rounds: int) -> dict[str, Timings]:
    """Each round, the same request to every side, in an order that rotates."""
    for n in range(WARM_UP):
        for client in clients.values():
            ask(client, n).raise_for_status()
    timings = {side: Timings() for side in SIDES}
    for n in range(rounds):
        for i in range(len(SIDES)):
            side = SIDES[(n + i) % len(SIDES)]
            timed(clients[side], ask, n, timings[side])
    return timings


def median_added(base: list[float], other: list[float]) -> float:
    """The median over rounds of `other` minus `base` in the same round."""
    return statistics.median(b - a for a, b in zip(base, other, strict=True))


@dataclass
class Row:
    kind: str
    sides: dict[str, Timings]

    def wall(self, side: str) -> float:
        return statistics.median(self.sides[side].wall_ms)

    def line(self) -> str:
        off, control, on = (self.sides[side].wall_ms for side in SIDES)
        return (
            f"| {self.kind} | {len(off)} | {self.wall('off'):.2f} | {self.wall('control'):.2f} "
            f"| {self.wall('on'):.2f} | {self.wall('on') / self.wall('off'):.3f} "
            f"| {median_added(off, on):+.2f} | {median_added(off, control):+.2f} |"
        )


def report(rows: list[Row], spans: int, traced_requests: int, command: str) -> str:
    chat = {side: timings.overhead_ms for side, timings in rows[-1].sides.items()}
    load = os.getloadavg()[0]
    lines = [
        "## Tracing on against off",
        "",
        f"Command: `{command}` ({date.today().isoformat()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, load average {load:.1f} at the end).",
        "",
        "One set of services (a fresh data folder, the default policy) behind three uvicorn "
        "servers on threads of one process: *off*, an app without tracing; *control*, a "
        "second one, to show what two identical sides differ by; *on*, an app with the "
        "tracer provider `OTEL_TRACES_EXPORTER=otlp` builds (the SDK's batch processor, its "
        "defaults) exporting to an OTLP/HTTP receiver on a thread of the same process. Each "
        "round the three answer the same request one after the other, in an order that "
        f"rotates, after {WARM_UP} untimed requests of each kind. Client wall time, medians "
        "in ms; *added* is the median over rounds of the side's time minus *off*'s.",
        "",
        "| request | rounds | off | control | on | on/off | added, on | added, control |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(row.line() for row in rows),
        "",
        "Chat's own `x-bastion-overhead-ms` (time not in the engine), median: "
        + ", ".join(f"{statistics.median(chat[side]):.1f} ms {side}" for side in SIDES)
        + f"; the receiver got {spans} spans for the {traced_requests} requests the traced "
        "app answered (warm-up included).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20, help="chat rounds; others get more")
    parser.add_argument("--no-write", action="store_true", help="print, leave the doc alone")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line a request otherwise
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        del os.environ[name]  # the untraced app reads them: none, so tracing off

    receiver = SpanReceiver()
    # The exporter reads its endpoint when it is built, as in `bastion serve`.
    with environment({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}):
        provider = build_tracer_provider(TracingConfig(exporters=("otlp",)))
    rows: list[Row] = []
    traced_requests = 0
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        started = time.monotonic()
        settings = Settings(data_dir=Path(tmp), policy_reload_seconds=0)
        services = load_services(settings)
        key, _ = create_key(services.sessions, settings.default_tenant, "user")
        print(f"services loaded in {time.monotonic() - started:.1f} s", flush=True)
        ports = {side: free_port() for side in SIDES}
        apps = {
            side: serve_in_thread(
                settings.model_copy(update={"port": port}),
                services,
                provider if side == "on" else None,
            )
            for side, port in ports.items()
        }
        with ExitStack() as serving:
            clients = {
                side: serving.enter_context(
                    httpx.Client(
                        base_url=serving.enter_context(app),
                        headers={"authorization": f"Bearer {key}"},
                        timeout=120,
                    )
                )
                for side, app in apps.items()
            }
            print(f"serving after {time.monotonic() - started:.1f} s", flush=True)
            for kind, ask, share in KINDS:
                rounds = round(args.rounds * share)
                rows.append(Row(kind, compare(clients, ask, rounds)))
                traced_requests += WARM_UP + rounds
                print(rows[-1].line(), flush=True)
        provider.shutdown()  # exports the spans still batched
        services.models.close()
        if services.engine is not None:
            services.engine.close()
    receiver.close()

    command = "flock /tmp/bench.lock .venv/bin/python bench/tracing_overhead.py"
    if args.rounds != 20:
        command += f" --rounds {args.rounds}"
    body = report(rows, receiver.spans, traced_requests, command)
    print(body)
    if not args.no_write:
        write_section("tracing", body)


if __name__ == "__main__":
    main()
