"""Where a `bastion serve` process spends its time: py-spy samples, grouped by stage.

    .venv/bin/python bench/profile_gateway.py                 # one stream, then 64 clients
    .venv/bin/python bench/profile_gateway.py --seconds 20 --no-write

The server runs with its defaults (bench/load.py's `start_server`); py-spy samples every
thread for the given seconds while streaming clients send the load bench's questions
(temperature 0.7, 96 tokens). A sample counts for the first stage, in the order of
STAGES, whose pattern matches a frame of its stack; waiting threads (idle workers, the
event loop's poll) are left out. Sampling slows the server, so read the shares, not the
throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from doc_section import write_section  # noqa: E402  (bench/ is on the path)
from load import run_clients, start_server, stop_server  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"
# (stage, pattern over one stack's frames); the first that matches takes the sample.
STAGES = (
    ("engine: native decode step", r"NativeDecoder\.step"),
    ("engine: sampling", r"engine/sampling\.py"),
    ("engine: PyTorch forward (prefill)", r"PagedLlama\.forward"),
    ("engine: scheduling and bookkeeping", r"engine/(core|scheduler|block_manager|paged_engine)"),
    ("detokenizer", r"detokenizer\.py|_decode \(transformers"),
    ("prompt tokenizing (chat template)", r"encode_chat|apply_chat_template"),
    ("guardrails: embedding (MiniLM)", r"guardrails/(injection|topics).*retrieval/embedder"),
    ("retrieval (embedding, search, rerank)", r"retrieval/"),
    ("guardrails: injection", r"guardrails/injection"),
    ("guardrails: PII", r"guardrails/pii|presidio"),
    ("output checks (streaming)", r"guardrails/(streaming|output_check|secrets|leaks)"),
    ("audit and database", r"gateway/audit|sqlalchemy"),
    ("HTTP, SSE and the event loop", r"uvicorn|litestar|gateway/chat/stream|asyncio"),
)
_IDLE = re.compile(
    r"_worker \(concurrent/futures/thread\.py:8\d\)$|Condition\.wait|_monitor|tqdm"
    r"|run \(gateway/commands/serve\.py:\d+\)$|Runner\.run \(asyncio/runners\.py:\d+\)$"
)


def record(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    command = [str(PY_SPY), "record", "-p", str(pid), "-t", "-r", "100", "-f", "raw"]
    return subprocess.Popen(
        [*command, "-o", str(out), "-d", str(seconds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )


def shares(raw: Path) -> list[tuple[str, float]]:
    """Each stage's share of the busy samples, largest first."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text(encoding="utf-8").splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        python = [f for f in frames if ".py:" in f]
        if not python or _IDLE.search(python[-1]) or "tqdm" in frames[0]:
            continue
        joined = ";".join(frames)
        stage = next((name for name, rx in STAGES if re.search(rx, joined)), "other")
        counts[stage] += int(n)
    total = sum(counts.values()) or 1
    return [(stage, count / total) for stage, count in counts.most_common()]


def profile(clients: int, seconds: int, tmp: Path) -> list[tuple[str, float]]:
    data_dir = tmp / f"data-{clients}"
    data_dir.mkdir()
    server = start_server(data_dir, tmp / f"serve-{clients}.log")
    try:
        asyncio.run(run_clients(server, 1, 3, 32))  # warm-up
        raw = tmp / f"profile-{clients}.txt"
        spy = record(server.process.pid, seconds, raw)
        asyncio.run(run_clients(server, clients, seconds - 1, 96))
        spy.wait(timeout=120)
    finally:
        stop_server(server)
    return shares(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {n: profile(n, args.seconds, Path(tmp)) for n in (1, 64)}
    stages = sorted(
        {s for run in runs.values() for s, _ in run}, key=lambda s: -dict(runs[1]).get(s, 0)
    )
    lines = [
        "## Where the time goes",
        "",
        f"Command: `.venv/bin/python bench/profile_gateway.py --seconds {args.seconds}`. "
        "py-spy samples of one `bastion serve` process (defaults) while 1 and then 64 "
        "streaming clients send requests (temperature 0.7, 96 tokens); share of the busy "
        "samples of all threads (idle workers and the event loop's wait left out).",
        "",
        "| stage | 1 stream | 64 clients |",
        "| --- | ---: | ---: |",
    ]
    for stage in stages:
        one, many = dict(runs[1]).get(stage, 0.0), dict(runs[64]).get(stage, 0.0)
        lines.append(f"| {stage} | {one:.1%} | {many:.1%} |")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("profile", body)


if __name__ == "__main__":
    main()
