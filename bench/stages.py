"""Where a request's time goes, stage by stage, when 15 share an 800-token system message
(the shared-system row of bench/gateway.py), read from the server's own trace spans.

    .venv/bin/python bench/stages.py

One `bastion serve` (defaults: the default policy, retrieval on) with
`OTEL_TRACES_EXPORTER=console`, so that each request's spans (auth, each input check,
retrieval, engine queue, prefill, decode, output checks, audit write) are written to its
log; one warm request, then 15 at once. For each stage: when it starts after its
request's server span began, and how long it lasts, medians over the 15 (the output
checks' window runs once a released chunk, so it has more spans than requests).
Printed, not written to the doc: the doc quotes a run in "Where the time goes".
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from load import start_server, stop_server  # noqa: E402  (bench/ is on the path)
from shared_prompt import questions, shared_system_message  # noqa: E402

CHAT_SPAN = "POST /v1/chat/completions"
CONCURRENT = 15


@dataclass(frozen=True)
class StageTiming:
    name: str
    start_ms: float  # after its request's server span began
    duration_ms: float


def spans_in(log_text: str) -> list[dict[str, Any]]:
    """The console exporter's spans (indented JSON objects) among the log's other lines."""
    decoder, position, spans = json.JSONDecoder(), 0, []
    while (start := log_text.find("{", position)) >= 0:
        try:
            value, position = decoder.raw_decode(log_text, start)
        except ValueError:
            position = start + 1
            continue
        if isinstance(value, dict) and {"context", "name", "start_time"} <= value.keys():
            spans.append(value)
    return spans


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def stage_timings(spans: list[dict[str, Any]], last: int) -> list[StageTiming]:
    """The stages of the `last` chat requests that reached the engine."""
    traces: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for span in spans:
        traces[span["context"]["trace_id"]].append(span)
    requests = []
    for trace in traces.values():
        roots = [s for s in trace if s["name"] == CHAT_SPAN]
        if roots and any(s["name"] == "engine.prefill" for s in trace):
            requests.append((_seconds(roots[0]["start_time"]), trace))
    timings = []
    for began, trace in sorted(requests, key=lambda r: r[0])[-last:]:
        for span in trace:
            start, end = _seconds(span["start_time"]), _seconds(span["end_time"])
            timings.append(StageTiming(span["name"], (start - began) * 1000, (end - start) * 1000))
    return timings


async def _first_text_s(base_url: str, key: str, messages: list[dict[str, str]]) -> float:
    """Seconds until the first text of a streamed answer."""
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        started = time.perf_counter()
        body = {"messages": messages, "max_tokens": 96, "temperature": 0, "stream": True}
        headers = {"authorization": f"Bearer {key}"}
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    break
        return time.perf_counter() - started


async def _together(base_url: str, key: str, prompts: list[list[dict[str, str]]]) -> list[float]:
    return list(await asyncio.gather(*(_first_text_s(base_url, key, p) for p in prompts)))


def main() -> None:
    os.environ["OTEL_TRACES_EXPORTER"] = "console"
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # ms: the spans reach the log promptly
    system = shared_system_message()
    prompts = [
        [{"role": "system", "content": system}, {"role": "user", "content": q}]
        for q in questions(CONCURRENT + 1)
    ]
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "serve.log"
        server = start_server(Path(scratch) / "data", log)
        try:
            asyncio.run(_together(server.base_url, server.api_key, prompts[:1]))
            firsts = asyncio.run(_together(server.base_url, server.api_key, prompts[1:]))
        finally:
            stop_server(server)  # the exporter flushes its last spans as the server stops
        timings = stage_timings(spans_in(log.read_text(encoding="utf-8")), CONCURRENT)
    print(f"{CONCURRENT} at once: client time to first text, mean {statistics.mean(firsts):.2f} s")
    print("| stage | spans | starts after, p50 ms | lasts, p50 ms | lasts, max ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    by_stage: dict[str, list[StageTiming]] = collections.defaultdict(list)
    for timing in timings:
        by_stage[timing.name].append(timing)
    for name, stage in sorted(
        by_stage.items(), key=lambda item: statistics.median(t.start_ms for t in item[1])
    ):
        print(
            f"| {name} | {len(stage)} | {statistics.median(t.start_ms for t in stage):.0f} | "
            f"{statistics.median(t.duration_ms for t in stage):.0f} | "
            f"{max(t.duration_ms for t in stage):.0f} |"
        )


if __name__ == "__main__":
    main()
