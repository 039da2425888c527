"""`bastion serve` from nothing: a fresh data folder, the seconds until `/readyz` answers
200, the idle server's resident memory, and what it logged. The cold-start test and
bench/cold_start.py share it (the bench also points it at an older checkout)."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.settings import REPO_ROOT
from tests.support.local_server import free_port, wait_until_ready

READY_TIMEOUT_S = 300.0
_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class ColdStart:
    """One start: seconds from the process's launch to `/readyz` 200, then idle RSS (less
    shared libraries' clean pages, `_rss_mb`)."""

    seconds_to_ready: float
    idle_rss_mb: float
    stderr_lines: tuple[str, ...]  # the logs (stdout holds the printed key, kept out)


def cold_start(
    repo: Path = REPO_ROOT,
    settle_s: float = 3.0,
    python: str = sys.executable,
    fresh_native_cache: bool = False,
) -> ColdStart:
    """Start `repo`'s gateway on a fresh data folder with JSON logs, wait until ready, let
    it idle `settle_s`, measure, and stop it with SIGTERM. With `fresh_native_cache` it
    starts as on a new machine: the native step built and the int8 weights prepared."""
    with tempfile.TemporaryDirectory(prefix="bastion-cold-") as scratch:
        folder = Path(scratch)
        port = free_port()
        env = {
            **os.environ,
            "BASTION_DATA_DIR": str(folder / "data"),
            "BASTION_PORT": str(port),
            "BASTION_LOG_JSON": "true",
            "PYTHONPATH": str(repo),
        }
        if fresh_native_cache:
            env["BASTION_NATIVE_CACHE_DIR"] = str(folder / "native")
        with (folder / "stdout").open("wb") as out, (folder / "stderr").open("wb") as err:
            started = time.perf_counter()
            process = subprocess.Popen(
                [python, "-m", "gateway.cli", "serve"], cwd=repo, env=env, stdout=out, stderr=err
            )
            try:
                wait_until_ready(f"http://127.0.0.1:{port}", READY_TIMEOUT_S, process, _POLL_S)
                seconds = time.perf_counter() - started
                time.sleep(settle_s)
                rss_mb = _rss_mb(process.pid)
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        lines = (folder / "stderr").read_text(errors="replace").splitlines()
    return ColdStart(seconds, rss_mb, tuple(lines))


@functools.cache
def this_checkout_cold_start() -> ColdStart:
    """One cold start of this checkout per test run, for the tests that read it."""
    return cold_start()


def _rss_mb(pid: int) -> float:
    """Resident memory of `pid` (Linux /proc/PID/smaps), in MiB, less the clean pages of
    shared libraries: those are code, shared with every process that maps the library and
    dropped by the kernel at will, and how many of them are mapped follows the page cache
    (libtorch_cpu.so alone read 67 MiB from a venv installed hours before, 114 from a fresh
    one, on the same server). Mapped model files and every written page count."""
    kib = 0
    library = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if not fields[0].endswith(":"):  # a mapping's header: address range ... path
            library = len(fields) >= 6 and re.search(r"\.so(\.|$)", fields[5]) is not None
        elif fields[0] == "Rss:":
            kib += int(fields[1])
        elif library and fields[0] in ("Shared_Clean:", "Private_Clean:"):
            kib -= int(fields[1])
    if kib <= 0:
        raise RuntimeError(f"no resident memory read for process {pid}")
    return kib / 1024
