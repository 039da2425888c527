"""Graceful drain on SIGTERM: `/readyz` turns 503 at once, new requests get 503
`shutting_down` (each with one audit record), answers in flight finish, then the server
stops.

The first tests run the real app behind `DrainingServer` on a thread and call its signal
handler directly (signals reach only the main thread); the last one restarts one of two
real `bastion serve` replicas on one PostgreSQL database under streaming load.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from engine import PagedEngine
from gateway.app import create_app
from gateway.http.draining_server import CUT_OFF_SECONDS, DrainingServer
from gateway.keys.store import create_key
from gateway.services import Services, load_services
from gateway.settings import REPO_ROOT, Settings
from tests.integration.conftest import LiveServer, RecordingEngine
from tests.support.local_server import free_port, wait_until_ready

CHAT_PATH = "/v1/chat/completions"
LONG_ANSWER = "Describe the sea in great detail."


@dataclass
class DrainingReplica:
    """The app behind `DrainingServer` on a thread, and what a test needs to drive it."""

    server: DrainingServer
    thread: threading.Thread
    live: LiveServer

    def sigterm(self) -> None:
        self.server.handle_exit(signal.SIGTERM, None)


@contextmanager
def draining_replica(
    tmp_path: Path, chat_engine: PagedEngine, drain_seconds: float
) -> Iterator[DrainingReplica]:
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
    settings = Settings(
        data_dir=tmp_path / "data",
        port=free_port(),
        policy_dir=policy_dir,
        policy_reload_seconds=0,
        sample_corpus=None,
        drain_seconds=drain_seconds,
    )
    engine = RecordingEngine(chat_engine)
    services: Services = load_services(settings, engine=engine)
    secret, _ = create_key(services.sessions, settings.default_tenant, "user")
    app = create_app(settings, services)
    config = uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning")
    server = DrainingServer(config, app.state.drain, settings.drain_seconds)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        wait_until_ready(base_url, 30, interval_s=0.1)
        live = LiveServer(base_url, secret, services, engine, settings)
        yield DrainingReplica(server, thread, live)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class Stream:
    """One streamed chat answer on its own thread: when its first token came, and its lines."""

    def __init__(self, base_url: str, key: str, request_id: str, max_tokens: int) -> None:
        self.first_token = threading.Event()
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self._args = (base_url, key, request_id, max_tokens)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        base_url, key, request_id, max_tokens = self._args
        body = {
            "messages": [{"role": "user", "content": LONG_ANSWER}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {key}", "x-request-id": request_id}
        try:
            with httpx.stream(
                "POST", f"{base_url}{CHAT_PATH}", json=body, headers=headers, timeout=120
            ) as response:
                for line in response.iter_lines():
                    self.lines.append(line)
                    if '"content"' in line:
                        self.first_token.set()
        except httpx.HTTPError as exc:
            self.error = exc

    @property
    def finished(self) -> bool:
        return "data: [DONE]" in self.lines


def refused_chat(base_url: str, key: str, request_id: str) -> httpx.Response:
    return httpx.post(
        f"{base_url}{CHAT_PATH}",
        headers={"authorization": f"Bearer {key}", "x-request-id": request_id},
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        timeout=30,
    )


def test_sigterm_refuses_new_requests_and_lets_the_stream_in_flight_finish(
    tmp_path: Path, chat_engine: PagedEngine
) -> None:
    with draining_replica(tmp_path, chat_engine, drain_seconds=50) as replica:
        live = replica.live
        stream = Stream(live.base_url, live.api_key, "drain_in_flight", max_tokens=48)
        assert stream.first_token.wait(60), (stream.error, stream.lines)
        replica.sigterm()

        ready = httpx.get(f"{live.base_url}/readyz", timeout=10)
        refused = refused_chat(live.base_url, live.api_key, "drain_refused")
        alive = httpx.get(f"{live.base_url}/healthz", timeout=10)
        assert not stream.finished, "the stream ended before the checks: lengthen it"

        assert ready.status_code == 503
        assert ready.json()["status"] == "draining"
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert refused.json()["error"]["type"] == "server_error"
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["x-request-id"] == "drain_refused"
        assert alive.status_code == 200  # liveness holds: the kubelet must not kill it

        stream.thread.join(60)
        assert stream.finished, stream.lines[-3:]
        replica.thread.join(10)
        assert not replica.thread.is_alive(), "the server did not stop once idle"
        assert replica.server.drain.seconds() < 50

        [answered] = live.audit_rows("drain_in_flight")
        assert (answered.status_code, answered.outcome) == (200, "ok")
        [refusal] = live.audit_rows("drain_refused")
        assert (refusal.status_code, refusal.error_code) == (503, "shutting_down")
        assert refusal.event == "request.rejected"


def test_an_idle_server_stops_at_once(tmp_path: Path, chat_engine: PagedEngine) -> None:
    with draining_replica(tmp_path, chat_engine, drain_seconds=50) as replica:
        started = time.monotonic()
        replica.sigterm()
        replica.thread.join(10)
        assert not replica.thread.is_alive()
        assert time.monotonic() - started < 3


def test_the_grace_period_bounds_the_drain(tmp_path: Path, chat_engine: PagedEngine) -> None:
    with draining_replica(tmp_path, chat_engine, drain_seconds=0.5) as replica:
        live = replica.live
        stream = Stream(live.base_url, live.api_key, "drain_cut", max_tokens=500)
        assert stream.first_token.wait(60), (stream.error, stream.lines)
        started = time.monotonic()
        replica.sigterm()
        replica.thread.join(0.5 + CUT_OFF_SECONDS + 5)
        assert not replica.thread.is_alive(), "the drain outlived its grace period"
        assert time.monotonic() - started < 0.5 + CUT_OFF_SECONDS + 5
        stream.thread.join(10)
        assert not stream.finished
        # Cut off, it is recorded as a cancelled answer, once.
        [cut] = live.audit_rows("drain_cut")
        assert (cut.status_code, cut.outcome) == (499, "cancelled")
