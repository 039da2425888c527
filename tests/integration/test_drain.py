"""Graceful drain on SIGTERM: `/readyz` turns 503 at once, new requests get 503
`shutting_down` (each with one audit record), answers in flight finish, then the server
stops.

The first tests run the real app behind `DrainingServer` on a thread and call its signal
handler directly (signals reach only the main thread); the last one restarts one of two
real `bastion serve` replicas on one PostgreSQL database under streaming load.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import select

from engine import PagedEngine
from gateway.app import create_app
from gateway.audit.chain import verify_chain
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database
from gateway.db.models import AuditRecord
from gateway.http.draining_server import CUT_OFF_SECONDS, DrainingServer
from gateway.keys.store import create_key
from gateway.services import Services, load_services
from gateway.settings import REPO_ROOT, Settings
from tests.integration.conftest import LiveServer, RecordingEngine
from tests.support.local_server import free_port, spawn_serve, wait_until_ready

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


# -- two real replicas ---------------------------------------------------------------------

REPLICA_ENV = {
    "BASTION_AUDIT_SIGNING_KEY": "d" * 64,  # one signing key for every replica
    "BASTION_ENGINE_THREADS": "1",  # two engines on a small machine
    "BASTION_POLICY_RELOAD_SECONDS": "0",
    "BASTION_LOG_JSON": "true",
}


class Replica:
    """One `bastion serve` process on the shared database, started and restarted on the
    same data folder and port, its output in a log file."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name, self.tmp_path = name, tmp_path
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log_file = (self.tmp_path / f"{self.name}-{self.starts}.log").open("wb")
        self.process = spawn_serve(self.tmp_path / f"data-{self.name}", self.port, log_file)

    @property
    def label(self) -> str:
        return f"{self.name}{self.starts}"

    def wait_ready(self) -> None:
        assert self.process is not None
        wait_until_ready(self.base_url, 300, self.process)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.running():
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


@dataclass
class Attempt:
    """One HTTP request of the load: where it went and what came back."""

    request_id: str
    replica: str
    status: int | None = None  # None: no response (no connection, or closed before one)
    error_code: str | None = None
    done: bool = False  # the stream ended with `[DONE]`


class Balancer:
    """What a load balancer does: routes to the replicas whose `/readyz` last said 200
    (polled every 0.5 s, as a readiness probe would), and retries a request another
    replica refused with 503 before it started, or one no replica answered."""

    def __init__(self, replicas: list[Replica], key: str) -> None:
        self.replicas, self.key = replicas, key
        self.in_rotation: set[str] = set()
        self.attempts: list[Attempt] = []
        self.requests: dict[str, list[Attempt]] = {}
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._turn = 0
        threading.Thread(target=self._probe, daemon=True).start()

    def _probe(self) -> None:
        while not self.stop.is_set():
            for replica in self.replicas:
                try:
                    ready = httpx.get(f"{replica.base_url}/readyz", timeout=2).status_code == 200
                except httpx.TransportError:
                    ready = False
                with self._lock:
                    (self.in_rotation.add if ready else self.in_rotation.discard)(replica.name)
            time.sleep(0.5)

    def _pick(self, avoid: str | None) -> Replica:
        while True:
            with self._lock:
                up = [r for r in self.replicas if r.name in self.in_rotation]
                self._turn += 1
            choices = [r for r in up if r.name != avoid] or up
            if choices:
                return choices[self._turn % len(choices)]
            time.sleep(0.1)

    def serve(self, client: int) -> None:
        """A client's loop: one short streamed answer after another, until `stop`."""
        number = 0
        while not self.stop.is_set():
            number += 1
            self.chat(f"load{client}_{number}")

    def chat(self, name: str) -> None:
        tried: list[Attempt] = []
        self.requests[name] = tried
        avoid: str | None = None
        while len(tried) < 6:
            replica = self._pick(avoid)
            attempt = Attempt(f"{name}_try{len(tried)}", replica.label)
            tried.append(attempt)
            self.attempts.append(attempt)
            if not self._send(replica, attempt):
                return
            avoid = replica.name

    def _send(self, replica: Replica, attempt: Attempt) -> bool:
        """Send one attempt; True when it may be retried elsewhere (it was not started)."""
        body = {
            "messages": [{"role": "user", "content": "How do I set up the VPN client?"}],
            "max_tokens": 6,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {self.key}", "x-request-id": attempt.request_id}
        try:
            with httpx.stream(
                "POST", f"{replica.base_url}{CHAT_PATH}", json=body, headers=headers, timeout=120
            ) as response:
                attempt.status = response.status_code
                if response.status_code != 200:
                    response.read()
                    attempt.error_code = response.json()["error"]["code"]
                    return attempt.error_code == "shutting_down"
                attempt.done = "data: [DONE]" in list(response.iter_lines())
                return False
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            # Refused, or closed before any response: the request never ran (checked below).
            return attempt.status is None or isinstance(exc, httpx.ConnectError)
        except httpx.TransportError:
            return False


def audit_rows_by_request(url: str) -> dict[str, list[AuditRecord]]:
    """Every audit record by request id, once the chain is verified."""
    database = make_db_engine(url)
    try:
        sessions = make_session_factory(database)
        with sessions() as session:
            rows = list(session.scalars(select(AuditRecord)))
        report = verify_chain(sessions)
        assert report.ok, report.problems
    finally:
        database.dispose()
    found: dict[str, list[AuditRecord]] = {}
    for row in rows:
        found.setdefault(row.request_id, []).append(row)
    return found


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_restarting_one_of_two_replicas_under_streaming_load_loses_no_request(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade_database(postgres_url)  # once here, not raced by two replicas starting
    database = make_db_engine(postgres_url)
    key, _ = create_key(make_session_factory(database), "default", "user")
    database.dispose()
    monkeypatch.setenv("BASTION_DATABASE_URL", postgres_url)
    monkeypatch.setenv("BASTION_SAMPLE_CORPUS", str(tmp_path / "no-corpus"))
    for name, value in REPLICA_ENV.items():
        monkeypatch.setenv(name, value)
    a, b = Replica("a", tmp_path), Replica("b", tmp_path)
    balancer = Balancer([a, b], key)
    clients = [threading.Thread(target=balancer.serve, args=(i,)) for i in range(3)]
    try:
        a.start()
        b.start()
        a.wait_ready()
        b.wait_ready()
        for thread in clients:
            thread.start()

        def served(label: str) -> int:
            return sum(t.done and t.replica == label for t in balancer.attempts)

        wait_until(lambda: served("a1") >= 2 and served("b1") >= 2, 120, "load on both")

        long_stream = Stream(a.base_url, key, "drain_long_a", max_tokens=160)
        assert long_stream.first_token.wait(60), (long_stream.error, long_stream.lines)
        assert a.process is not None
        terminated = time.monotonic()
        a.process.send_signal(signal.SIGTERM)

        def not_ready() -> bool:
            return httpx.get(f"{a.base_url}/readyz", timeout=5).status_code == 503

        wait_until(not_ready, 5, "/readyz to turn 503")
        assert a.running(), "/readyz must say 503 while the replica still runs"
        refused = refused_chat(a.base_url, key, "drain_refused_a")
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert "retry-after" in refused.headers

        assert a.process.wait(60) == 0
        drained_in = time.monotonic() - terminated
        assert drained_in < 50, f"the drain took {drained_in:.0f} s, past BASTION_DRAIN_SECONDS"
        long_stream.thread.join(10)
        assert long_stream.finished, long_stream.lines[-3:]

        a.start()
        a.wait_ready()
        wait_until(lambda: served("a2") >= 2, 120, "the restarted replica to serve")
        balancer.stop.set()
        for thread in clients:
            thread.join(120)
        for replica in (a, b):
            assert replica.process is not None
            replica.process.send_signal(signal.SIGTERM)
            assert replica.process.wait(60) == 0
    finally:
        balancer.stop.set()
        a.kill()
        b.kill()

    for name, tried in balancer.requests.items():
        assert tried and tried[-1].done, f"{name} was lost: {tried}"
    records = audit_rows_by_request(postgres_url)
    for attempt in balancer.attempts:
        found = records.get(attempt.request_id, [])
        if attempt.status is None:
            assert found == [], f"{attempt} never reached a server, yet it was recorded"
            continue
        assert len(found) == 1, f"{attempt}: {len(found)} records"
        assert (found[0].status_code, found[0].error_code) == (
            attempt.status,
            attempt.error_code,
        ), attempt
    for request_id, status in (("drain_long_a", 200), ("drain_refused_a", 503)):
        assert [r.status_code for r in records[request_id]] == [status]
