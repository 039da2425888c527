"""`kill -9` of a real `bastion serve` under load, then a restart on the same data folder:
the audit chain verifies, no request is half-recorded, documents and indexes agree."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import verify_chain
from gateway.audit.subject_keys import TextOpener
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.models import AuditRecord
from gateway.keys.store import create_key
from retrieval import VectorIndex
from retrieval.models import Chunk
from tests.integration.test_policy_reload import wait_for
from tests.support.local_server import free_port, spawn_serve, wait_until_ready

CHAT_PATH = "/v1/chat/completions"
EMBEDDING_DIM = 384


@dataclass
class Traffic:
    """What the clients saw before the server died."""

    chats: dict[str, bool] = field(default_factory=dict)  # request id -> saw `[DONE]`
    documents: dict[str, str] = field(default_factory=dict)  # acknowledged id -> its word
    stop: threading.Event = field(default_factory=threading.Event)


@contextmanager
def bastion_serve(data_dir: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """`bastion serve` as its own process, once `/readyz` answers 200; killed at the end."""
    process = spawn_serve(data_dir, port, subprocess.DEVNULL)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", 300, process)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def chat_client(base: str, key: str, traffic: Traffic) -> None:
    with httpx.Client(base_url=base, headers={"authorization": f"Bearer {key}"}) as client:
        while not traffic.stop.is_set():
            request_id = f"crash_{uuid.uuid4().hex}"
            traffic.chats[request_id] = False
            body = {
                "messages": [{"role": "user", "content": "How do I set up the VPN client?"}],
                "max_tokens": 12,
                "stream": True,
            }
            try:
                with client.stream(
                    "POST", CHAT_PATH, json=body, headers={"x-request-id": request_id}, timeout=60
                ) as response:
                    lines = list(response.iter_lines())
                traffic.chats[request_id] = "data: [DONE]" in lines
            except httpx.TransportError:
                return


def document_client(base: str, key: str, traffic: Traffic) -> None:
    with httpx.Client(base_url=base, headers={"authorization": f"Bearer {key}"}) as client:
        while not traffic.stop.is_set():
            word = f"zq{uuid.uuid4().hex[:10]}"
            text = f"# Note {word}\n\nThe codeword {word} opens the archive room.\n"
            try:
                response = client.post(
                    "/documents",
                    files={"file": (f"{word}.md", text.encode(), "text/markdown")},
                    data={"collection": "crash"},
                    timeout=60,
                )
            except httpx.TransportError:
                return
            if response.status_code == 201:
                traffic.documents[response.json()["id"]] = word


@pytest.mark.slow
def test_kill_9_under_load_then_restart(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    database = make_db_engine(f"sqlite:///{(data_dir / 'bastion.db').resolve()}")
    traffic = Traffic()
    with bastion_serve(data_dir, port) as process:
        sessions = make_session_factory(database)
        user = (data_dir / "default-api-key.txt").read_text().strip()
        admin, _ = create_key(sessions, "default", "admin")
        clients = [
            threading.Thread(target=chat_client, args=(base, user, traffic)) for _ in range(4)
        ]
        clients.append(threading.Thread(target=document_client, args=(base, admin, traffic)))
        for thread in clients:
            thread.start()
        # Kill while requests are in flight, once some have finished on both paths.
        wait_for(lambda: any(traffic.chats.copy().values()) and len(traffic.documents) >= 2, 120)
        os.kill(process.pid, signal.SIGKILL)
        traffic.stop.set()
        for thread in clients:
            thread.join(timeout=60)
    assert any(not done for done in traffic.chats.values()), "nothing was in flight"

    with bastion_serve(data_dir, port):
        report = verify_chain(sessions)
        assert report.ok, report.problems
        assert_no_half_records(sessions, traffic)
        assert_documents_consistent(sessions, data_dir, base, admin, traffic)
        served = httpx.post(
            f"{base}{CHAT_PATH}",
            headers={"authorization": f"Bearer {user}"},
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            timeout=60,
        )
        assert served.status_code == 200
        assert verify_chain(sessions).ok
    database.dispose()


def assert_no_half_records(sessions: sessionmaker[Session], traffic: Traffic) -> None:
    """A finished chat has its one complete record; one cut off has one record or none."""
    with sessions() as session:
        rows = list(session.scalars(select(AuditRecord).where(AuditRecord.endpoint == CHAT_PATH)))
        opener = TextOpener(session)
        for row in rows:  # sealed text still opens: its key was committed with it
            opener.open(row.prompt_text)
            opener.open(row.answer_text)
    by_request: dict[str, list[AuditRecord]] = {}
    for row in rows:
        by_request.setdefault(row.request_id, []).append(row)
    for request_id, done in traffic.chats.items():
        found = by_request.get(request_id, [])
        assert len(found) <= 1, request_id
        if done:
            assert [(r.status_code, r.outcome) for r in found] == [(200, "ok")], request_id


def assert_documents_consistent(
    sessions: sessionmaker[Session], data_dir: Path, base: str, admin: str, traffic: Traffic
) -> None:
    """Every acknowledged document survived and is found; no chunk lacks its vector."""
    with sessions() as session:
        chunk_ids = set(session.scalars(select(Chunk.id).where(Chunk.collection == "crash")))
    index = VectorIndex.open(data_dir / "indexes" / "default" / "crash.faiss", EMBEDDING_DIM)
    assert chunk_ids <= set(index.ids().tolist())
    for document_id, word in traffic.documents.items():
        found = httpx.post(
            f"{base}/documents/search",
            headers={"authorization": f"Bearer {admin}"},
            json={"query": word, "collections": ["crash"], "mode": "lexical", "min_score": -1},
            timeout=60,
        ).json()["data"]
        assert document_id in {hit["document_id"] for hit in found}, word
