"""Load benchmark: concurrent streaming clients against one real `bastion serve` process.

    .venv/bin/python bench/load.py                          # 64 clients, 3 minutes, rewrites
                                                            # the load section of the doc
    .venv/bin/python bench/load.py --clients 8 --seconds 20 --no-write   # a short form

The server runs as its own process on 127.0.0.1 with its defaults (SmolLM2 on the paged
engine, the default policy, SQLite in a fresh data folder). Every client sends streamed
chat requests back to back, each with its own `x-request-id`. Reported: requests per
second, time to first token and inter-token latency, errors (only 429s are deliberate),
the server's resident memory after warm-up and at the end. Afterwards every request must
have exactly one audit record and the audit chain must verify.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from doc_section import write_section  # noqa: E402  (bench/ is on the path)

from gateway.audit.chain import verify_chain  # noqa: E402
from gateway.db.connection import make_db_engine, make_session_factory  # noqa: E402
from gateway.db.models import AuditRecord  # noqa: E402
from tests.support.local_server import free_port, spawn_serve, wait_until_ready  # noqa: E402

CHAT_PATH = "/v1/chat/completions"
# Questions over the sample corpus, so that retrieval and the guardrails do real work.
QUESTIONS = (
    "How do I set up the VPN client?",
    "How many vacation days do I get?",
    "What should I do if my laptop is stolen?",
    "How do I reset my password?",
    "Who approves travel expenses?",
    "Can I work from another country for a month?",
)
ALLOWED = frozenset({200, 429})  # 429: the engine's queue is full, a deliberate refusal
CI_NOTE = (
    "CI runs short forms: `tests/integration/test_short_load.py` (8 streaming clients for "
    "6 s against the real app: only 200 or 429, one audit record each, the chain verifies) "
    "and the fault tests `test_client_disconnect.py` (blocks freed at once), "
    "`test_database_outage.py` (503 while the database is down, no unaudited answer) and "
    "`test_server_crash.py` (slow: `kill -9` under load, then restart)."
)


@dataclass
class Outcome:
    """One request as its client saw it."""

    request_id: str
    started: float
    status: int | None = None  # None: no HTTP response (connection failed)
    completed: bool = False  # a 200 stream that ended with `[DONE]`
    first_token_s: float | None = None
    token_gaps_s: list[float] = field(default_factory=list)
    total_s: float = 0.0


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    base_url: str
    api_key: str
    data_dir: Path

    def rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("the server process has no VmRSS")


def start_server(data_dir: Path, log_file: Path, timeout_s: float = 600) -> Server:
    """`bastion serve` in its own process; returns once `/readyz` answers 200."""
    port = free_port()
    with log_file.open("wb") as log:
        process = spawn_serve(data_dir, port, log)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url, timeout_s, process)
    except RuntimeError as error:
        process.kill()
        raise RuntimeError(f"{error}; see {log_file}") from error
    key = (data_dir / "default-api-key.txt").read_text().strip()
    return Server(process, base_url, key, data_dir)


def stop_server(server: Server) -> None:
    os.killpg(server.process.pid, signal.SIGTERM)
    server.process.wait(timeout=60)


async def one_request(client: httpx.AsyncClient, n: int, max_tokens: int) -> Outcome:
    outcome = Outcome(request_id=f"load_{uuid.uuid4().hex}", started=time.perf_counter())
    body = {
        "messages": [{"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "stream": True,
    }
    last: float | None = None
    try:
        async with client.stream(
            "POST", CHAT_PATH, json=body, headers={"x-request-id": outcome.request_id}
        ) as response:
            outcome.status = response.status_code
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    outcome.completed = response.status_code == 200
                    break
                choices = json.loads(line[6:]).get("choices") or [{}]
                if not choices[0].get("delta", {}).get("content"):
                    continue
                now = time.perf_counter()
                if last is None:
                    outcome.first_token_s = now - outcome.started
                else:
                    outcome.token_gaps_s.append(now - last)
                last = now
    except httpx.HTTPError:
        pass
    outcome.total_s = time.perf_counter() - outcome.started
    return outcome


async def run_clients(
    server: Server, clients: int, seconds: float, max_tokens: int
) -> list[Outcome]:
    """`clients` loops sending one request after another until `seconds` have passed."""
    deadline = time.perf_counter() + seconds
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=server.base_url,
        headers={"authorization": f"Bearer {server.api_key}"},
        timeout=httpx.Timeout(600, connect=30),
        limits=limits,
    ) as client:

        async def loop(worker: int) -> None:
            n = worker
            while time.perf_counter() < deadline:
                outcomes.append(await one_request(client, n, max_tokens))
                n += clients

        await asyncio.gather(*(loop(w) for w in range(clients)))
    return outcomes


@dataclass
class AuditCheck:
    requests: int
    with_one_record: int
    problems: list[str]
    chain_records: int
    chain_ok: bool


def check_audit(data_dir: Path, outcomes: list[Outcome]) -> AuditCheck:
    """Each request that reached the server has exactly one record; the chain verifies."""
    engine = make_db_engine(f"sqlite:///{(data_dir / 'bastion.db').resolve()}")
    sessions = make_session_factory(engine)
    problems: list[str] = []
    with sessions() as session:
        counts = dict(
            session.execute(
                select(AuditRecord.request_id, func.count())
                .where(AuditRecord.endpoint == CHAT_PATH)
                .group_by(AuditRecord.request_id)
            ).all()
        )
    sent = {o.request_id: o for o in outcomes}
    ones = 0
    for request_id, outcome in sent.items():
        found = counts.get(request_id, 0)
        if found == 1:
            ones += 1
        elif outcome.status is not None or found > 1:
            problems.append(f"{request_id}: {found} records (status {outcome.status})")
    strangers = set(counts) - set(sent)
    if strangers:
        problems.append(f"{len(strangers)} chat records of requests nobody sent")
    report = verify_chain(sessions)
    engine.dispose()
    problems += report.problems
    return AuditCheck(len(sent), ones, problems, report.records, report.ok)


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Figures:
    requests: int
    completed: int
    seconds: float
    rps: float
    ttft_p50: float
    ttft_p99: float
    itl_p50_ms: float
    itl_p99_ms: float
    total_p50: float
    statuses: Counter[str]
    errors: int


def summarise(outcomes: list[Outcome], seconds: float) -> Figures:
    statuses = Counter("no response" if o.status is None else str(o.status) for o in outcomes)
    done = [o for o in outcomes if o.completed]
    first = [o.first_token_s for o in done if o.first_token_s is not None]
    gaps = [gap for o in done for gap in o.token_gaps_s]
    unfinished = sum(1 for o in outcomes if o.status == 200 and not o.completed)
    errors = unfinished + sum(1 for o in outcomes if o.status not in ALLOWED)
    return Figures(
        requests=len(outcomes),
        completed=len(done),
        seconds=seconds,
        rps=len(done) / seconds,
        ttft_p50=percentile(first, 0.5),
        ttft_p99=percentile(first, 0.99),
        itl_p50_ms=percentile(gaps, 0.5) * 1e3,
        itl_p99_ms=percentile(gaps, 0.99) * 1e3,
        total_p50=statistics.median(o.total_s for o in done) if done else float("nan"),
        statuses=statuses,
        errors=errors,
    )


def render(
    command: str,
    args: argparse.Namespace,
    figures: Figures,
    rss: tuple[float, float, float],
    audit: AuditCheck,
    loads: tuple[float, float],
) -> str:
    start, end, peak = rss
    growth = (end - start) / start * 100
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(figures.statuses.items()))
    lines = [
        "## Load",
        "",
        f"Command: `{command}`. One `bastion serve` process on 127.0.0.1 with its defaults "
        "(SmolLM2-135M-Instruct on the paged engine, CPU, the default policy, SQLite); "
        f"{args.clients} clients each send streamed chat requests back to back "
        f"({args.max_tokens} new tokens at most, questions over the sample corpus) for "
        f"{args.seconds:.0f} s after a {args.warmup:.0f} s warm-up that is not counted. "
        f"Machine: {os.cpu_count()} CPUs shared with other engineers' jobs (load average "
        f"{loads[0]:.1f} at the start, {loads[1]:.1f} at the end), Python "
        f"{platform.python_version()}: absolute figures are noisy, so latencies are medians "
        "(p50) with p99 beside them.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| completed requests | {figures.completed} of {figures.requests} in "
        f"{figures.seconds:.0f} s ({figures.rps:.2f} requests/s) |",
        f"| time to first token p50 / p99 | {figures.ttft_p50:.2f} s / {figures.ttft_p99:.2f} s |",
        f"| inter-token latency p50 / p99 | {figures.itl_p50_ms:.0f} ms / "
        f"{figures.itl_p99_ms:.0f} ms |",
        f"| whole request p50 | {figures.total_p50:.2f} s |",
        f"| responses by status | {statuses} |",
        f"| errors (anything but 200 with `[DONE]` or a deliberate 429) | {figures.errors} |",
        f"| server resident memory after warm-up -> end (peak) | {start:.0f} -> {end:.0f} MiB "
        f"({growth:+.1f}%; peak {peak:.0f} MiB; goal <= +10%) |",
        f"| audit | {audit.with_one_record} of {audit.requests} requests (warm-up included) "
        f"have exactly one record; chain of {audit.chain_records} records "
        f"{'verifies' if audit.chain_ok else 'does NOT verify'} |",
        "",
        "Reading: the engine decodes at most `BASTION_ENGINE_MAX_SEQS` answers at once (64 "
        "by default) and queues the rest, so with more clients than that the time to first "
        "token is mostly time spent waiting in the queue; below it, the first text waits for "
        "its first word and whatever the output checks still hold (its end while it may "
        "become an entity, at most 48 characters) while every running answer takes its turn "
        "a step; inter-token latency is the gap between streamed chunks of one answer, which "
        "grows with the batch.",
    ]
    if audit.problems:
        lines += ["", "Audit problems: " + "; ".join(audit.problems[:5])]
    lines += ["", CI_NOTE]
    return "\n".join(lines)


async def measure(
    server: Server, args: argparse.Namespace
) -> tuple[list[Outcome], list[Outcome], float, tuple[float, float, float]]:
    """Warm up, then measure; memory is sampled every second while the clients run.
    Returns the warm-up's and the measured requests, the measured wall time and memory."""
    samples: list[float] = []
    stop = asyncio.Event()

    async def sample_memory() -> None:
        while not stop.is_set():
            samples.append(server.rss_mib())
            await asyncio.sleep(1)

    warmup = await run_clients(server, args.clients, args.warmup, args.max_tokens)
    rss_start = server.rss_mib()
    sampler = asyncio.create_task(sample_memory())
    began = time.perf_counter()
    outcomes = await run_clients(server, args.clients, args.seconds, args.max_tokens)
    elapsed = time.perf_counter() - began  # the last requests end after `seconds`
    stop.set()
    await sampler
    rss_end = server.rss_mib()
    return warmup, outcomes, elapsed, (rss_start, rss_end, max([*samples, rss_end]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=64, help="concurrent streaming clients")
    parser.add_argument("--seconds", type=float, default=180, help="measured duration")
    parser.add_argument("--warmup", type=float, default=20, help="uncounted warm-up, seconds")
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per request")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args()
    command = " ".join(["bench/load.py", *sys.argv[1:]]).replace(" --no-write", "")
    with tempfile.TemporaryDirectory(prefix="bastion-load-") as folder:
        data_dir = Path(folder) / "data"
        print(f"starting bastion serve (data in {data_dir})", flush=True)
        server = start_server(data_dir, Path(folder) / "serve.log")
        load_start = os.getloadavg()[0]
        try:
            warmup, outcomes, elapsed, rss = asyncio.run(measure(server, args))
        finally:
            stop_server(server)
        load_end = os.getloadavg()[0]
        audit = check_audit(data_dir, warmup + outcomes)
    figures = summarise(outcomes, elapsed)
    body = render(f".venv/bin/python {command}", args, figures, rss, audit, (load_start, load_end))
    print(body)
    if not args.no_write:
        write_section("load", body)
    ok = figures.errors == 0 and audit.chain_ok and not audit.problems
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
