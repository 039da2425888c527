"""Time to ready and idle memory of a fresh `bastion serve`, this checkout against a
baseline commit, runs alternating, medians printed as a Markdown table.

    flock /tmp/bench.lock .venv/bin/python -m bench.cold_start [--runs 3] [--baseline REV]

Each run starts the gateway on a new data folder (migrations, the first key, the sample
corpus ingested), polls `/readyz` every 50 ms, lets the ready server idle 3 s and reads its
RSS. The native step's build and the engine's prepared int8 weights stay in their cache
folder between runs (engine/prepared_weights.py), as on a machine that has run Bastion
before or in the container image; only the first start on a machine prepares them. The
baseline is checked out in a temporary `git worktree` under /tmp and run with this
checkout's virtual environment; by default it is the commit before the direct GGUF loader
(engine/gguf_file.py) was added. The log columns count stderr lines that are not one JSON
record (a second format) and records at warning level or above.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.settings import REPO_ROOT
from tests.support.cold_start import ColdStart, cold_start


def default_baseline() -> str:
    """The parent of the commit that added engine/gguf_file.py."""
    added = _git("log", "--format=%H", "--diff-filter=A", "--", "engine/gguf_file.py")
    return _git("rev-parse", f"{added.split()[-1]}^").strip()


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """`revision` checked out under /tmp, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="bastion-baseline-", dir="/tmp"))
    _git("worktree", "add", "--detach", str(folder), revision)
    try:
        yield folder
    finally:
        _git("worktree", "remove", "--force", str(folder))


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout


def log_counts(start: ColdStart) -> tuple[int, int]:
    """(lines that are not a JSON record, records at warning level or above)."""
    other_format = loud = 0
    for line in start.stderr_lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            other_format += 1
            continue
        if not isinstance(record, dict):
            other_format += 1
        elif record.get("level") in ("warning", "error", "critical"):
            loud += 1
    return other_format, loud


def stage_seconds(start: ColdStart) -> dict[str, float]:
    """The gateway's own stage timings (`gateway.stage_loaded`, `gateway.services_ready`)."""
    stages: dict[str, float] = {}
    for line in start.stderr_lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("event") == "gateway.stage_loaded":
            stages[record["stage"]] = record["seconds"]
        elif record.get("event") == "gateway.services_ready":
            stages["services (all)"] = record["seconds"]
    return stages


def summary_row(name: str, starts: list[ColdStart]) -> str:
    ready = statistics.median(s.seconds_to_ready for s in starts)
    rss = statistics.median(s.idle_rss_mb for s in starts)
    counts = [log_counts(s) for s in starts]
    other_format = max(c[0] for c in counts)
    loud = max(c[1] for c in counts)
    runs = ", ".join(f"{s.seconds_to_ready:.1f}" for s in starts)
    return f"| {name} | {ready:.1f} ({runs}) | {rss:.0f} | {other_format} | {loud} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", help="a commit to compare with (default: see above)")
    args = parser.parse_args()
    baseline = args.baseline or default_baseline()
    current: list[ColdStart] = []
    before: list[ColdStart] = []
    with worktree(baseline) as old_checkout:
        for _ in range(args.runs):
            before.append(cold_start(old_checkout))
            current.append(cold_start())
    head = _git("rev-parse", "--short", "HEAD").strip()
    print("| checkout | ready, s: median (runs) | idle RSS, MiB | lines not JSON | warnings |")
    print("| --- | --- | --- | --- | --- |")
    print(summary_row(f"baseline {baseline[:7]}", before))
    print(summary_row(f"this checkout ({head}, and its working tree)", current))
    print()
    print("| stage (this checkout, side by side) | median s |")
    print("| --- | --- |")
    stages = [stage_seconds(s) for s in current]
    for stage in stages[0]:
        print(f"| {stage} | {statistics.median(s[stage] for s in stages if stage in s):.2f} |")


if __name__ == "__main__":
    main()
