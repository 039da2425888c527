"""The database goes away: chat fails closed with 503 (never an unaudited answer), `/readyz`
says not ready, and serving resumes when the database comes back.

A TCP proxy stands between the gateway and the real PostgreSQL; stopping it is the outage.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import verify_chain
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.models import AuditRecord
from gateway.keys.store import create_key
from gateway.services import load_services
from gateway.settings import REPO_ROOT, Settings
from tests.integration.conftest import LiveServer
from tests.support.local_server import free_port, serve_in_thread

POSTGRES = ("127.0.0.1", 5432)
LONG_ANSWER = "Describe the sea in great detail."


class TcpProxy:
    """Forwards connections from a local port to PostgreSQL; `stop` cuts every connection
    and refuses new ones until `start` is called again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        assert self._listener is not None
        _close(self._listener)  # shutdown wakes the thread blocked in accept()
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # the listener was closed
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@dataclass
class OutageServer:
    base_url: str
    api_key: str
    proxy: TcpProxy
    direct: sessionmaker[Session]  # straight to PostgreSQL, for the test's own reads
    live: LiveServer

    def chat(self, content: str = "Name a colour.", max_tokens: int = 4) -> httpx.Response:
        return httpx.post(
            f"{self.base_url}/v1/chat/completions",
            headers={"authorization": f"Bearer {self.api_key}"},
            json={"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens},
            timeout=120,
        )

    def records(self, request_id: str) -> int:
        with self.direct() as session:
            query = select(func.count()).where(AuditRecord.request_id == request_id)
            return int(session.scalar(query) or 0)

    def reached_engine(self, before: int) -> Callable[[], bool]:
        return lambda: len(self.live.engine.received) > before


@pytest.fixture
def outage_server(
    live_server: LiveServer, postgres_url: str, tmp_path: Path
) -> Iterator[OutageServer]:
    """A second gateway whose database is PostgreSQL behind the proxy; it shares the live
    server's engine and embedder (loading them again would take most of the test's time)."""
    proxy = TcpProxy(POSTGRES)
    proxy.start()
    settings = Settings(
        data_dir=tmp_path,
        port=free_port(),
        database_url=postgres_url.replace(
            f"{POSTGRES[0]}:{POSTGRES[1]}", f"127.0.0.1:{proxy.port}"
        ),
        policy_dir=REPO_ROOT / "policies",
        policy_reload_seconds=0,
        sample_corpus=None,
    )
    services = load_services(
        settings, engine=live_server.engine, embedder=live_server.services.embedder
    )
    sessions = services.sessions
    direct_engine = make_db_engine(postgres_url)
    secret, _ = create_key(sessions, settings.default_tenant, "user")
    try:
        with serve_in_thread(settings, services) as base_url:
            yield OutageServer(
                base_url, secret, proxy, make_session_factory(direct_engine), live_server
            )
    finally:
        proxy.stop()
        sessions.kw["bind"].dispose()
        direct_engine.dispose()


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def assert_fails_closed(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "database_unavailable"
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert int(response.headers["retry-after"]) > 0


def test_requests_fail_closed_while_the_database_is_down(outage_server: OutageServer) -> None:
    server = outage_server
    served = server.chat()
    assert served.status_code == 200
    assert server.records(served.headers["x-request-id"]) == 1

    server.proxy.stop()
    assert httpx.get(f"{server.base_url}/readyz", timeout=30).status_code == 503
    refused = server.chat()
    assert_fails_closed(refused)
    assert server.records(refused.headers["x-request-id"]) == 0

    server.proxy.start()
    wait_for(lambda: httpx.get(f"{server.base_url}/readyz", timeout=30).status_code == 200)
    resumed = server.chat()
    assert resumed.status_code == 200
    assert server.records(resumed.headers["x-request-id"]) == 1
    report = verify_chain(server.direct)
    assert report.ok, report.problems


def test_an_answer_that_cannot_be_audited_is_withheld(outage_server: OutageServer) -> None:
    """The database fails while the engine is generating: the finished answer is not sent."""
    server = outage_server
    before = len(server.live.engine.received)
    outcome: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: outcome.append(server.chat(LONG_ANSWER, max_tokens=24))
    )
    worker.start()
    wait_for(server.reached_engine(before))
    server.proxy.stop()
    worker.join(timeout=120)
    assert_fails_closed(outcome[0])
    server.proxy.start()
    assert server.records(outcome[0].headers["x-request-id"]) == 0


def test_a_stream_that_cannot_be_audited_ends_in_an_error(outage_server: OutageServer) -> None:
    """Streamed text is already out; the client gets an error event, never `[DONE]`."""
    server = outage_server
    body = {
        "messages": [{"role": "user", "content": LONG_ANSWER}],
        "max_tokens": 32,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {server.api_key}"}
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/chat/completions",
        headers=headers,
        json=body,
        timeout=120,
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        server.proxy.stop()
        rest = [line for line in lines if line.startswith("data: ")]
    server.proxy.start()
    assert "data: [DONE]" not in rest
    assert '"code":"database_unavailable"' in rest[-1].replace(" ", "")
    assert server.records(response.headers["x-request-id"]) == 0
