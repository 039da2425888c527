"""Audit log benchmark: append throughput on SQLite and PostgreSQL (one writer; four writer
threads sharing one AuditLog, as inside one gateway; four writer processes, as four
replicas), 32 records handed over at once (as 32 streams that end together: how long until
the last is durable, and how many commits they take), the cost of sealing text, and the
write's share of a short chat request's latency through the real app. Rewrites the audit
section of docs/benchmarks.md.

Run: .venv/bin/python bench/audit.py
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from doc_section import write_section  # noqa: E402  (bench/ is on the path)

from gateway.audit.chain import AppendedRecord, verify_chain  # noqa: E402
from gateway.audit.log import AuditEntry, AuditLog  # noqa: E402
from gateway.db.connection import make_db_engine, make_session_factory  # noqa: E402
from gateway.db.migrations import upgrade_database  # noqa: E402
from guardrails.verdict import Verdict  # noqa: E402
from tests.support.local_server import free_port, serve_in_thread  # noqa: E402
from tests.support.temporary_schema import temporary_schema  # noqa: E402

POSTGRES_URL = os.environ.get(
    "BASTION_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
PROMPT = "How do I reset the VPN token on a managed laptop? " * 8  # about 400 characters
ANSWER = "Open the self-service portal, choose Devices, then Reset token. " * 5


def entry(n: int, content: bool = True) -> AuditEntry:
    """A typical chat record: three verdicts, citations, text kept as the policy allows."""
    return AuditEntry(
        request_id=f"bench_{uuid.uuid4().hex}",
        endpoint="/v1/chat/completions",
        tenant="bench",
        key_id="key_bench",
        end_user=f"user-{n % 50}",
        policy_version="e6ca0b244cda" * 5,
        model="SmolLM2-135M-Instruct",
        outcome="ok",
        status_code=200,
        verdicts=[
            Verdict("prompt_injection", "allow", 0.03),
            Verdict("pii", "redact", 0.85, ("EMAIL x1",)),
            Verdict("topics", "allow", 0.61),
        ],
        chunk_ids=[11, 12, 40],
        prompt_tokens=96,
        completion_tokens=48,
        latency_ms=250.0,
        engine_ms=230.0,
        prompt_text=PROMPT,
        answer_text=ANSWER,
        store_content=content,
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


@dataclass
class Throughput:
    records_per_s: float
    p50_ms: float
    p99_ms: float


def single_writer(url: str, count: int, content: bool = True) -> Throughput:
    engine = make_db_engine(url)
    log = AuditLog(make_session_factory(engine))
    log.record(entry(0, content))  # warm the connection pool and the key table
    samples = []
    started = time.perf_counter()
    for n in range(count):
        began = time.perf_counter()
        log.record(entry(n, content))
        samples.append(time.perf_counter() - began)
    elapsed = time.perf_counter() - started
    engine.dispose()
    return Throughput(
        count / elapsed, percentile(samples, 0.5) * 1e3, percentile(samples, 0.99) * 1e3
    )


def writer_threads(url: str, writers: int, count_each: int) -> float:
    """Threads sharing one AuditLog, as the gateway's worker threads do."""
    engine = make_db_engine(url)
    log = AuditLog(make_session_factory(engine))
    log.record(entry(0))
    start = threading.Barrier(writers + 1)

    def work() -> None:
        start.wait()
        for n in range(count_each):
            log.record(entry(n))

    threads = [threading.Thread(target=work) for _ in range(writers)]
    for thread in threads:
        thread.start()
    start.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    engine.dispose()
    return writers * count_each / elapsed


@dataclass
class Burst:
    size: int
    last_durable_ms: float  # median over bursts
    commits: float  # median commits a burst


def burst(url: str, size: int, bursts: int) -> Burst:
    """`size` threads sharing one AuditLog each hand over one record at the same moment:
    the time until the last returns (its record committed), and the commits made."""
    engine = make_db_engine(url)
    commits = [0]
    event.listen(engine, "commit", lambda _connection: commits.__setitem__(0, commits[0] + 1))
    log = AuditLog(make_session_factory(engine))
    log.record(entry(0))
    times, counts = [], []
    for _ in range(bursts):
        start = threading.Barrier(size + 1)

        def work(n: int, start: threading.Barrier = start) -> None:
            start.wait()
            log.record(entry(n))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(size)]
        for thread in threads:
            thread.start()
        before = commits[0]
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            thread.join()
        times.append(time.perf_counter() - began)
        counts.append(commits[0] - before)
    engine.dispose()
    return Burst(size, statistics.median(times) * 1e3, statistics.median(counts))


def _process_writer(url: str, count: int, ready: Any, go: Any) -> None:
    engine = make_db_engine(url)
    log = AuditLog(make_session_factory(engine))
    log.record(entry(0))
    ready.release()
    go.wait()
    for n in range(count):
        log.record(entry(n))
    engine.dispose()


def writer_processes(url: str, writers: int, count_each: int) -> float:
    """Processes with their own engine and AuditLog, as replicas sharing one database."""
    context = multiprocessing.get_context("fork")  # after imports: no start-up in the timing
    ready, go = context.Semaphore(0), context.Event()
    processes = [
        context.Process(target=_process_writer, args=(url, count_each, ready, go))
        for _ in range(writers)
    ]
    for process in processes:
        process.start()
    for _ in processes:
        ready.acquire()
    started = time.perf_counter()
    go.set()
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"a writer process failed with exit code {process.exitcode}")
    return writers * count_each / (time.perf_counter() - started)


@contextmanager
def sqlite_database() -> Iterator[str | None]:
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'audit.db'}"
        upgrade_database(url)
        yield url


@contextmanager
def postgres_database() -> Iterator[str | None]:
    with temporary_schema(POSTGRES_URL, "bastion_bench") as url:
        if url is not None:
            upgrade_database(url)
        yield url


@dataclass
class Backend:
    """One database's figures."""

    sealed: Throughput
    plain: Throughput
    threads: float
    processes: float
    burst: Burst


def measure_backend(
    name: str, database: Callable[[], AbstractContextManager[str | None]], count: int
) -> Backend | None:
    with database() as url:
        if url is None:
            print(f"{name}: no server answers, skipped")
            return None
        figures = Backend(
            sealed=single_writer(url, count, content=True),
            plain=single_writer(url, count, content=False),
            threads=writer_threads(url, 4, count // 4),
            processes=writer_processes(url, 4, count // 4),
            burst=burst(url, 32, 10),
        )
        engine = make_db_engine(url)
        report = verify_chain(make_session_factory(engine))
        engine.dispose()
        if not report.ok:
            raise RuntimeError(f"{name}: the chain does not verify: {report.problems}")
    print(name, figures)
    return figures


class TimedAuditLog(AuditLog):
    """The gateway's AuditLog, timing each write made inside a request."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        super().__init__(sessions)
        self.samples: list[float] = []

    def record(self, entry: AuditEntry) -> AppendedRecord:
        began = time.perf_counter()
        try:
            return super().record(entry)
        finally:
            self.samples.append(time.perf_counter() - began)

    async def record_async(self, entry: AuditEntry) -> AppendedRecord:
        began = time.perf_counter()
        try:
            return await super().record_async(entry)
        finally:
            self.samples.append(time.perf_counter() - began)


@dataclass
class ChatLatency:
    requests: int
    chat_p50_ms: float
    chat_p99_ms: float
    audit_p50_ms: float
    audit_p99_ms: float


def chat_latency(requests: int) -> ChatLatency:
    """Short non-streamed chats through the real app (uvicorn, SQLite, SmolLM2 on CPU)."""
    from gateway.keys.store import create_key
    from gateway.services import load_services
    from gateway.settings import Settings

    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(data_dir=Path(folder), port=free_port(), device="cpu")
        services = load_services(settings)
        timed = TimedAuditLog(services.sessions)
        services.audit = timed
        secret, _ = create_key(services.sessions, settings.default_tenant, "user")
        with (
            serve_in_thread(settings, services) as base,
            httpx.Client(base_url=base, timeout=120) as client,
        ):
            samples = []
            for n in range(requests + 3):
                began = time.perf_counter()
                response = client.post(
                    "/v1/chat/completions",
                    headers={"authorization": f"Bearer {secret}"},
                    json={
                        "messages": [{"role": "user", "content": f"Say hello number {n}."}],
                        "max_tokens": 8,
                        "temperature": 0,
                        "user": f"user-{n % 5}",
                    },
                )
                response.raise_for_status()
                if n >= 3:  # the first requests warm caches
                    samples.append(time.perf_counter() - began)
        services.engine.close()
    writes = timed.samples[3:]
    return ChatLatency(
        requests=requests,
        chat_p50_ms=percentile(samples, 0.5) * 1e3,
        chat_p99_ms=percentile(samples, 0.99) * 1e3,
        audit_p50_ms=percentile(writes, 0.5) * 1e3,
        audit_p99_ms=percentile(writes, 0.99) * 1e3,
    )


def render(
    count: int, backends: dict[str, Backend | None], chat: ChatLatency | None, seconds: float
) -> str:
    lines = [
        "## Audit log",
        "Command: `.venv/bin/python bench/audit.py` "
        f"({count} records per run; {seconds:.0f} s; Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, shared with other work while measured). "
        "Each record is a typical chat record (three verdicts, three citations, about 700 "
        "characters of prompt and answer text). Every chain verified afterwards.",
        "",
        "| database | 1 writer, text sealed | p50 / p99 per write | 1 writer, no text "
        "| 4 threads, one AuditLog | 4 processes | 32 at once: last durable after, commits |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, figures in backends.items():
        if figures is None:
            lines.append(f"| {name} | not measured (no server) | | | | | |")
            continue
        lines.append(
            f"| {name} | {figures.sealed.records_per_s:,.0f} records/s "
            f"| {figures.sealed.p50_ms:.2f} / {figures.sealed.p99_ms:.2f} ms "
            f"| {figures.plain.records_per_s:,.0f} records/s "
            f"| {figures.threads:,.0f} records/s | {figures.processes:,.0f} records/s "
            f"| {figures.burst.last_durable_ms:.0f} ms, {figures.burst.commits:.0f} commits |"
        )
    lines.append("")
    if chat is None:
        lines.append("Chat latency: not measured (`--no-chat`).")
    else:
        share = chat.audit_p50_ms / chat.chat_p50_ms * 100
        lines += [
            f"Share of a request: {chat.requests} short non-streamed chats (8 tokens, "
            "SmolLM2-135M on CPU, SQLite, the real app behind uvicorn): end-to-end p50 "
            f"{chat.chat_p50_ms:.0f} ms (p99 {chat.chat_p99_ms:.0f} ms); the audit write "
            f"inside them p50 {chat.audit_p50_ms:.2f} ms (p99 {chat.audit_p99_ms:.2f} ms), "
            f"{share:.1f}% of the p50 request.",
        ]
    lines += [
        "",
        "Reading: records that wait at the same time are written together (group commit, "
        "`gateway/audit/group_commit.py`) in one transaction that reads their subjects' keys "
        "and links them along the chain under its lock, so 32 records that arrive at once "
        "take a few commits instead of one each. The writer builds plain rows rather than ORM "
        "objects and runs statements built once, and a SQLite writer links onto the head it "
        "wrote last instead of reading it each time: in a loaded server each statement on the "
        "writer thread waits for the event loop to hand back the GIL.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1000, help="records per run")
    parser.add_argument("--requests", type=int, default=20, help="chat requests to time")
    parser.add_argument("--no-chat", action="store_true", help="skip the chat latency part")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args()
    started = time.perf_counter()
    backends = {
        "SQLite (WAL)": measure_backend("SQLite", sqlite_database, args.records),
        "PostgreSQL": measure_backend("PostgreSQL", postgres_database, args.records),
    }
    chat = None if args.no_chat else chat_latency(args.requests)
    print(chat)
    body = render(args.records, backends, chat, time.perf_counter() - started)
    print(body)
    if not args.no_write:
        write_section("audit", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
