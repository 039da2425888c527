"""llama.cpp's `llama-server` serving the SmolLM2 GGUF: the real OpenAI-compatible upstream
the upstream-engine tests talk to. The binary comes from `scripts/build_llama_server.sh`
(built on first use, then cached), so these tests run wherever the suite does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import httpx

from engine import default_model_source
from tests.support.local_server import free_port, wait_until_ready

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_llama_server.sh"
MODEL_ALIAS = "smollm2"


@cache
def llama_server_binary() -> Path:
    """The cached binary, built first when missing (minutes, once per machine)."""
    pip = Path(sys.executable).with_name("pip")
    env = os.environ | ({"PIP": str(pip)} if pip.exists() else {})
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], env=env, check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(result.stdout.strip().splitlines()[-1])


def smollm2_gguf() -> Path:
    source = default_model_source()
    assert source.gguf_file is not None
    return source.folder / source.gguf_file


@dataclass(frozen=True, slots=True)
class LlamaServer:
    """A running server: `base_url` ends in `/v1` (what a models file names), `root` is
    where llama.cpp's own endpoints are (`/health`, `/slots`, `/tokenize`)."""

    process: subprocess.Popen[bytes]
    root: str

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def kill(self) -> None:
        """SIGKILL, as a crash would: open connections drop without an answer's end."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def busy_slots(self) -> int:
        slots = httpx.get(f"{self.root}/slots", timeout=5).json()
        return sum(1 for slot in slots if slot["is_processing"])


@contextmanager
def running_llama_server(
    context: int = 2048,
    parallel: int = 2,
    threads: int = 1,
    startup_s: float = 120.0,
    port: int | None = None,
) -> Iterator[LlamaServer]:
    """`llama-server` on `port` (a free one when None) with a small context (`context /
    parallel` tokens a slot), until the block ends; waits for `/health` to answer 200. A
    server restarted on the port of one killed keeps the URL a models file names."""
    port = port or free_port()
    command = [
        str(llama_server_binary()),
        "--model", str(smollm2_gguf()),
        "--alias", MODEL_ALIAS,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(context),
        "--parallel", str(parallel),
        "--threads", str(threads),
        "--no-webui",
        "--metrics",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    server = LlamaServer(process, f"http://127.0.0.1:{port}")
    try:
        wait_until_ready(server.root, startup_s, process, interval_s=0.2, probe="/health")
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
