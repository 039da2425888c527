"""A Bastion server on 127.0.0.1 for tests and benchmarks: a free port, the real app on a
thread or `bastion serve` as its own process, and the wait until `/readyz` answers 200."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import httpx

from gateway.settings import REPO_ROOT

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from gateway.services import Services
    from gateway.settings import Settings


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_ready(
    base_url: str,
    timeout_s: float,
    process: subprocess.Popen[Any] | None = None,
    interval_s: float = 0.5,
    probe: str = "/readyz",
) -> None:
    """Poll `probe` (Bastion's `/readyz`, llama.cpp's `/health`) until it answers 200;
    RuntimeError when `timeout_s` passes first or the server's `process` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{base_url}: the server exited with {process.returncode}")
        try:
            if httpx.get(f"{base_url}{probe}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(interval_s)
    raise RuntimeError(f"{base_url} was not ready after {timeout_s:.0f} s")


def spawn_serve(data_dir: Path, port: int, output: IO[bytes] | int) -> subprocess.Popen[bytes]:
    """`bastion serve` on `data_dir` and `port` in its own process group (so that a signal
    to the group reaches its workers too), its output going to `output`."""
    env = os.environ | {"BASTION_DATA_DIR": str(data_dir), "BASTION_PORT": str(port)}
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve"],
        cwd=REPO_ROOT,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@contextmanager
def serve_in_thread(
    settings: Settings, services: Services, tracer_provider: TracerProvider | None = None
) -> Iterator[str]:
    """The real app behind uvicorn on `settings.port`, on a thread; yields its base URL once
    `/readyz` answers 200. `tracer_provider` traces its requests (else the OTEL_* variables)."""
    import uvicorn  # here, not above: the process helpers must not load the whole app

    from gateway.app import create_app
    from gateway.http.access_log import log_each_request

    config = uvicorn.Config(
        log_each_request(create_app(settings, services, tracer_provider)),
        host="127.0.0.1",
        port=settings.port,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        wait_until_ready(base_url, 30, interval_s=0.1)
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
