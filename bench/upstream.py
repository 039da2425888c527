"""Bastion's added latency in front of an upstream server (issue 20 item 1's bench).

    .venv/bin/python bench/upstream.py              # rewrites the upstream section of the doc
    .venv/bin/python bench/upstream.py --quick --no-write
    .venv/bin/python bench/upstream.py --upstream paced   # prints; the doc keeps llama-server's

One llama.cpp `llama-server` (built by scripts/build_llama_server.sh, serving the SmolLM2
GGUF) is called directly and through one `bastion serve` whose models file names it as the
upstream (the embedded engine off). Each round sends the same streamed, greedy chats to
each side in turn, one at a time and then 32 at once; the direct side is sent the messages
Bastion forwards (the policy's system prompt, then the question), and the bench checks that
both sides' prompt token counts match. Each side asks questions of its own (a ticket number
apart), so that no side finds another's prompt in llama-server's prompt cache, and the
order of the sides turns from round to round. Tenants:
- `bare`: every check, the streaming hold-back and retrieval off: what the gateway itself
  adds (the goal's figure);
- `checks`: the default policy's input and output checks, retrieval off: the guardrails'
  own time on top.
Added latency is the median through Bastion minus the median direct, for the time to the
first token and for the whole answer, per round; the report gives the median over rounds.

The client's heap is frozen once both servers are warm: a full collection of it would
stop the client for about 200 ms in whichever round it fell, a pause that is not Bastion's.

llama-server's own times move with the machine's load by more than the goal's 20 ms, so
`--upstream paced` puts bench/paced_upstream.py in its place: first token 100 ms after the
request, then one every 25 ms, whatever the load; what is added over it is Bastion's.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from doc_section import write_section  # noqa: E402  (bench/ is on the path)
from load import QUESTIONS, start_server, stop_server  # noqa: E402

from gateway.db.connection import make_db_engine, make_session_factory  # noqa: E402
from gateway.keys.store import create_key  # noqa: E402
from tests.support.llama_server import MODEL_ALIAS, running_llama_server  # noqa: E402
from tests.support.local_server import free_port, wait_until_ready  # noqa: E402

MODEL_ID = "smollm2-upstream"
MAX_TOKENS = 32
CONCURRENT = 32
SYSTEM_PROMPT = "You are Northwind's internal assistant. Answer briefly and truthfully."
TENANTS = ("bare", "checks")
OUTPUT_CHECKS = ("pii", "secrets", "leaks")


@dataclass(frozen=True)
class Timing:
    first_token_s: float
    total_s: float
    prompt_tokens: int
    completion_tokens: int


async def one_stream(
    client: httpx.AsyncClient, headers: dict[str, str], messages: list[dict[str, str]], model: str
) -> Timing:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    attempts_left = 3
    while True:
        try:
            return await _stream_once(client, headers, body, started)
        except httpx.RemoteProtocolError:
            # A kept-alive connection the server closed as it was reused: retried, as the
            # openai client retries it, on either side.
            attempts_left -= 1
            if attempts_left == 0:
                raise


async def _stream_once(
    client: httpx.AsyncClient, headers: dict[str, str], body: dict[str, object], started: float
) -> Timing:
    first: float | None = None
    prompt_tokens = completion_tokens = 0
    async with client.stream("POST", "/chat/completions", json=body, headers=headers) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.status_code}: {(await answer.aread())[:300]!r}")
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt_tokens = int(chunk["usage"]["prompt_tokens"])
                completion_tokens = int(chunk["usage"]["completion_tokens"])
            choices = chunk.get("choices") or [{}]
            if first is None and choices[0].get("delta", {}).get("content"):
                first = time.perf_counter()
    ended = time.perf_counter()
    return Timing((first or ended) - started, ended - started, prompt_tokens, completion_tokens)


@dataclass(frozen=True)
class Side:
    """Where a chat goes: straight to llama-server, or through Bastion as a tenant."""

    name: str
    base_url: str
    model: str
    headers: dict[str, str]
    with_system: bool  # the direct side sends the system prompt Bastion would add

    def messages(self, question: str) -> list[dict[str, str]]:
        user = [{"role": "user", "content": question}]
        return [{"role": "system", "content": SYSTEM_PROMPT}, *user] if self.with_system else user


async def run_side(side: Side, questions: list[str], concurrent: bool) -> list[Timing]:
    limits = httpx.Limits(max_connections=CONCURRENT * 2)
    async with httpx.AsyncClient(base_url=side.base_url, timeout=600, limits=limits) as client:
        calls = [one_stream(client, side.headers, side.messages(q), side.model) for q in questions]
        if concurrent:
            return list(await asyncio.gather(*calls))
        return [await call for call in calls]


@dataclass(frozen=True)
class Upstream:
    """The server both sides end at: its `/v1` URL, its name for the model, and what it is."""

    base_url: str
    model: str
    described: str


@contextmanager
def running_upstream(kind: str) -> Iterator[Upstream]:
    """llama-server, or the paced server, until the block ends."""
    if kind == "llama-server":
        threads = max(1, (os.cpu_count() or 2) // 2)
        with running_llama_server(
            context=CONCURRENT * 512, parallel=CONCURRENT, threads=threads
        ) as server:
            yield Upstream(
                server.base_url, MODEL_ALIAS, f"llama-server ({MODEL_ALIAS}, SmolLM2-135M Q8 GGUF)"
            )
        return
    port = free_port()
    script = Path(__file__).with_name("paced_upstream.py")
    process = subprocess.Popen([sys.executable, str(script), str(port)], start_new_session=True)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", 30, process, interval_s=0.1, probe="/health")
        yield Upstream(
            f"http://127.0.0.1:{port}/v1",
            "paced",
            "bench/paced_upstream.py (first token at 100 ms, then one every 25 ms)",
        )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


def write_setup(folder: Path, upstream: Upstream) -> tuple[Path, Path]:
    """The policies of the two tenants and the models file naming the upstream."""
    default = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text(encoding="utf-8"))
    default["retrieval"]["enabled"] = False
    default["model"]["system_prompt"] = SYSTEM_PROMPT
    bare = copy.deepcopy(default)
    for section, checks in (("input", ("injection", "pii", "topics")), ("output", OUTPUT_CHECKS)):
        for check in checks:
            bare[section][check] = {"enabled": False}
    bare["output"]["stream_window_chars"] = 0  # nothing to check, so nothing held back
    policies = folder / "policies"
    policies.mkdir(parents=True)
    for name, policy in (("bare", bare), ("checks", default)):
        policy["name"], policy["applies_to"] = name, {"tenants": [name]}
        (policies / f"{name}.yaml").write_text(yaml.safe_dump(policy), encoding="utf-8")
    models = folder / "models.yaml"
    models.write_text(
        yaml.safe_dump(
            {
                "embedded": False,
                "models": [
                    {
                        "id": MODEL_ID,
                        "upstream": {
                            "base_urls": [upstream.base_url],
                            "model": upstream.model,
                            "max_concurrency": CONCURRENT,
                        },
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    return policies, models


def tenant_keys(data_dir: Path) -> dict[str, str]:
    sessions = make_session_factory(make_db_engine(f"sqlite:///{data_dir / 'bastion.db'}"))
    return {t: create_key(sessions, t, "user")[0] for t in TENANTS}


def medians(timings: list[Timing]) -> tuple[float, float]:
    return (
        statistics.median(t.first_token_s for t in timings) * 1000,
        statistics.median(t.total_s for t in timings) * 1000,
    )


def report(
    rows: dict[tuple[str, str], list[tuple[float, float]]], rounds: int, upstream: Upstream
) -> str:
    lines = [
        f"`.venv/bin/python bench/upstream.py` on {platform.machine()}, {os.cpu_count()} "
        f"cores, {rounds} rounds; {upstream.described} direct "
        f"and through `bastion serve` (embedded engine off), greedy, {MAX_TOKENS} tokens a "
        "streamed answer. Medians over rounds of each round's median, in ms; *added* is "
        "through Bastion minus direct in the same round.",
        "",
        "| streams | side | time to first token | whole answer | added to first token | "
        "added to whole answer |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for load in ("1", str(CONCURRENT)):
        direct = rows[(load, "direct")]
        for side in ("direct", *TENANTS):
            these = rows[(load, side)]
            first = statistics.median(r[0] for r in these)
            whole = statistics.median(r[1] for r in these)
            if side == "direct":
                lines.append(f"| {load} | {side} | {first:.1f} | {whole:.1f} | | |")
                continue
            added_first = statistics.median(r[0] - d[0] for r, d in zip(these, direct, strict=True))
            added_whole = statistics.median(r[1] - d[1] for r, d in zip(these, direct, strict=True))
            lines.append(
                f"| {load} | Bastion, `{side}` | {first:.1f} | {whole:.1f} | "
                f"{added_first:+.1f} | {added_whole:+.1f} |"
            )
    lines += [
        "",
        "Goal: p50 added ≤ 20 ms beyond the guardrails' own time, which is the `bare` rows "
        "(every check off); the `checks` rows add the default policy's input checks and the "
        "output checks' hold-back window.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--singles", type=int, default=12, help="one-at-a-time chats a round")
    parser.add_argument("--quick", action="store_true", help="1 round, 4 singles")
    parser.add_argument("--no-write", action="store_true", help="print, leave the doc alone")
    parser.add_argument(
        "--upstream",
        choices=("llama-server", "paced"),
        default="llama-server",
        help="what both sides call; only llama-server's figures are written to the doc",
    )
    args = parser.parse_args()
    rounds, singles = (1, 4) if args.quick else (args.rounds, args.singles)
    threads = max(1, (os.cpu_count() or 2) // 2)
    with (
        tempfile.TemporaryDirectory(prefix="bastion-upstream-") as scratch,
        running_upstream(args.upstream) as upstream,
    ):
        folder = Path(scratch)
        policies, models = write_setup(folder, upstream)
        os.environ |= {
            "BASTION_POLICY_DIR": str(policies),
            "BASTION_MODELS_FILE": str(models),
            "BASTION_ENGINE_THREADS": str(threads),
        }
        data_dir = folder / "data"
        server = start_server(data_dir, folder / "serve.log")
        try:
            keys = tenant_keys(data_dir)
            sides = [Side("direct", upstream.base_url, upstream.model, {}, with_system=True)]
            sides += [
                Side(t, f"{server.base_url}/v1", MODEL_ID, {"authorization": f"Bearer {keys[t]}"},
                     with_system=False)
                for t in TENANTS
            ]  # fmt: skip
            for side in sides:  # warm both servers and every tenant's caches
                asyncio.run(run_side(side, QUESTIONS[:2], concurrent=False))
            gc.collect()  # the client's heap, frozen (see above)
            gc.freeze()
            rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for number in range(rounds):
                print(f"round {number + 1}/{rounds}", file=sys.stderr)
                # Each side's questions are its own, so that none finds another's prompt in
                # llama-server's prompt cache, and the order of sides turns each round.
                order = sides[number % len(sides) :] + sides[: number % len(sides)]
                for load, concurrent, count in (
                    ("1", False, singles),
                    (str(CONCURRENT), True, CONCURRENT),
                ):
                    prompt_tokens: dict[str, list[int]] = {}
                    for side in order:
                        ticket = 1000 + 100 * (number * len(sides) + sides.index(side))
                        questions = [
                            f"{QUESTIONS[i % len(QUESTIONS)]} (ticket {ticket + i})"
                            for i in range(count)
                        ]
                        timings = asyncio.run(run_side(side, questions, concurrent))
                        rows.setdefault((load, side.name), []).append(medians(timings))
                        prompt_tokens[side.name] = sorted(t.prompt_tokens for t in timings)
                        answered = sum(t.completion_tokens for t in timings) / len(timings)
                        print(
                            f"  {load} {side.name}: {answered:.1f} tokens an answer",
                            file=sys.stderr,
                        )
                    if len({tuple(v) for v in prompt_tokens.values()}) != 1:
                        raise RuntimeError(f"the sides' prompts differ: {prompt_tokens}")
        finally:
            stop_server(server)
    body = report(rows, rounds, upstream)
    print(body)
    if not args.no_write and args.upstream == "llama-server":
        write_section("upstream", "## Bastion in front of an upstream server\n\n" + body)


if __name__ == "__main__":
    main()
