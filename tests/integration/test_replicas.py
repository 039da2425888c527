"""Two real `bastion serve` replicas on one PostgreSQL schema and one Redis, as a Deployment
runs them (each its own data folder, one policy folder as a mounted ConfigMap): what one
replica does to keys, rate-limit counts, policies, documents and the audit chain, the other
sees at once. One pair serves the whole module; the tests alternate between the replicas.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import select

from gateway.audit.chain import verify_chain
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database
from gateway.db.models import AuditRecord
from gateway.keys.store import create_key
from gateway.limits.rate_limit import WINDOW_SECONDS
from gateway.policy.schema import load_policy
from gateway.settings import REPO_ROOT
from tests.conftest import POSTGRES_URL
from tests.integration.test_drain import REPLICA_ENV, Replica
from tests.support.temporary_schema import temporary_schema

pytestmark = pytest.mark.slow

REDIS_URL = "redis://127.0.0.1:6379/0"
CHAT_PATH = "/v1/chat/completions"
REQUESTS_PER_MINUTE = 3
BLOCKED_WORDS = "quartz lantern"

LOCKER_DOC = b"""# Northwind Kayak Storage

## Kayak racks
Staff who paddle to the office may keep a kayak on the racks behind building C.
Racks cost 7 EUR a month; the harbour office hands out the rack padlocks.
"""
LOCKER_QUESTION = "Where can I keep my kayak at the office?"
SEED_DOC = b"""# Northwind Canteen

## Opening hours
The canteen on the ground floor serves lunch from 11:30 to 14:00 on weekdays.
"""


def policy_text(name: str, tenant: str, extra: str = "") -> str:
    return (
        f"name: {name}\n"
        f"applies_to:\n  tenants: [{tenant}]\n"
        "retrieval:\n  collections: [docs]\n  min_score: 0.1\n"
        "model:\n  max_tokens: 8\n" + extra
    )


@dataclass
class Pair:
    """The two replicas, their shared state, and the keys the fixture made in it."""

    a: Replica
    b: Replica
    database_url: str
    policy_dir: Path
    tenant: str  # keys, documents and the audit chain
    admin: str = field(repr=False)
    user: str = field(repr=False)
    auditor: str = field(repr=False)
    limited_tenant: str  # its policy allows REQUESTS_PER_MINUTE per key
    edited_tenant: str  # its policy file is edited by a test
    edited_admin: str = field(repr=False)
    # Every `/v1` request the tests send, for the one-record-per-request check.
    sent: list[str] = field(default_factory=list)

    def chat(
        self, replica: Replica, key: str, content: str = "Hi", max_tokens: int = 1
    ) -> httpx.Response:
        request_id = f"replicas_{uuid.uuid4().hex[:12]}"
        self.sent.append(request_id)
        return httpx.post(
            f"{replica.base_url}{CHAT_PATH}",
            headers={"authorization": f"Bearer {key}", "x-request-id": request_id},
            json={
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
            timeout=120,
        )

    def audit_rows(self) -> list[AuditRecord]:
        database = make_db_engine(self.database_url)
        try:
            with make_session_factory(database)() as session:
                return list(session.scalars(select(AuditRecord)))
        finally:
            database.dispose()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def redis_answers() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if not redis_answers():
        pytest.skip("no Redis server answers on 127.0.0.1:6379")
    with temporary_schema(POSTGRES_URL, "bastion_replicas") as database_url:
        if database_url is None:
            pytest.skip("no PostgreSQL server answers on 127.0.0.1:5432")
        tmp_path = tmp_path_factory.mktemp("replicas")
        # Rate-limit buckets in Redis are named by tenant and key id: fresh names keep this
        # run's counts apart from other runs on the same Redis.
        run = uuid.uuid4().hex[:8]
        tenant, limited, edited = f"acme-{run}", f"limited-{run}", f"edited-{run}"
        policy_dir = tmp_path / "policies"
        policy_dir.mkdir()
        shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
        (policy_dir / "acme.yaml").write_text(policy_text("acme", tenant))
        limits = f"rate_limits:\n  key_requests_per_minute: {REQUESTS_PER_MINUTE}\n"
        (policy_dir / "limited.yaml").write_text(policy_text("limited", limited, limits))
        (policy_dir / "edited.yaml").write_text(policy_text("edited", edited))

        upgrade_database(database_url)  # once here, not raced by two replicas starting
        database = make_db_engine(database_url)
        sessions = make_session_factory(database)
        keys = {
            name: create_key(sessions, owner, role)[0]
            for name, owner, role in (
                ("admin", tenant, "admin"),
                ("user", tenant, "user"),
                ("auditor", tenant, "auditor"),
                ("edited_admin", edited, "admin"),
            )
        }
        database.dispose()

        a, b = Replica("a", tmp_path), Replica("b", tmp_path)
        try:
            with pytest.MonkeyPatch.context() as env:
                for name, value in REPLICA_ENV.items():
                    env.setenv(name, value)
                env.setenv("BASTION_DATABASE_URL", database_url)
                env.setenv("BASTION_REDIS_URL", REDIS_URL)
                env.setenv("BASTION_POLICY_DIR", str(policy_dir))
                env.setenv("BASTION_POLICY_RELOAD_SECONDS", "0.3")
                env.setenv("BASTION_SAMPLE_CORPUS", str(tmp_path / "no-corpus"))
                a.start()
                b.start()
            a.wait_ready()
            b.wait_ready()
            yield Pair(
                a,
                b,
                database_url,
                policy_dir,
                tenant,
                keys["admin"],
                keys["user"],
                keys["auditor"],
                limited,
                edited,
                keys["edited_admin"],
            )
        finally:
            stop([a, b])


def stop(replicas: list[Replica]) -> None:
    """SIGTERM to each replica's process group (they drain at once, idle), SIGKILL to any
    still running a minute later."""
    for replica in replicas:
        if replica.process is not None and replica.running():
            os.killpg(replica.process.pid, signal.SIGTERM)
    for replica in replicas:
        if replica.process is not None:
            try:
                replica.process.wait(60)
            except subprocess.TimeoutExpired:
                replica.kill()


def new_key(replica: Replica, admin: str) -> tuple[str, str]:
    """A user key made through `replica`'s admin API: (id, secret)."""
    made = httpx.post(
        f"{replica.base_url}/admin/keys", headers=bearer(admin), json={"role": "user"}, timeout=30
    )
    assert made.status_code == 201, made.text
    assert made.json()["warnings"] == []  # the replica sees the tenant's policy
    return made.json()["id"], made.json()["key"]


def test_a_key_created_on_one_replica_works_on_the_other(pair: Pair) -> None:
    key_id, secret = new_key(pair.a, pair.admin)

    answered = pair.chat(pair.b, secret)
    assert answered.status_code == 200, answered.text
    listed = httpx.get(f"{pair.b.base_url}/admin/keys", headers=bearer(pair.admin), timeout=30)
    assert key_id in {k["id"] for k in listed.json()["data"]}


def test_a_key_revoked_on_one_replica_is_refused_by_the_other_at_once(pair: Pair) -> None:
    key_id, secret = new_key(pair.b, pair.admin)
    assert pair.chat(pair.b, secret).status_code == 200  # B has seen the key work

    revoked = httpx.delete(
        f"{pair.a.base_url}/admin/keys/{key_id}", headers=bearer(pair.admin), timeout=30
    )
    assert revoked.status_code == 200, revoked.text
    refused = pair.chat(pair.b, secret)

    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    error = refused.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    assert pair.chat(pair.a, secret).status_code == 401


def test_a_per_key_rate_limit_counts_requests_on_both_replicas(pair: Pair) -> None:
    database = make_db_engine(pair.database_url)
    key, _ = create_key(make_session_factory(database), pair.limited_tenant, "user")
    database.dispose()
    # The limit counts in fixed one-minute windows: start early in one.
    if WINDOW_SECONDS - time.time() % WINDOW_SECONDS < 15:
        time.sleep(WINDOW_SECONDS - time.time() % WINDOW_SECONDS + 0.1)

    replicas = [pair.a, pair.b] * REQUESTS_PER_MINUTE
    admitted = [pair.chat(r, key) for r in replicas[:REQUESTS_PER_MINUTE]]
    # Counted per replica, the next on either would still be admitted.
    refused = [pair.chat(r, key) for r in replicas[REQUESTS_PER_MINUTE:][:2]]

    assert [r.status_code for r in admitted] == [200] * REQUESTS_PER_MINUTE
    for response in refused:
        assert response.status_code == 429, response.text
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert f"{REQUESTS_PER_MINUTE} requests per minute" in error["message"]
        assert 1 <= int(response.headers["retry-after"]) <= WINDOW_SECONDS


def policy_version(replica: Replica, admin: str) -> str:
    status = httpx.get(f"{replica.base_url}/admin/policies", headers=bearer(admin), timeout=30)
    [policy] = status.json()["data"]
    return str(policy["version"])


def wait_for_version(replica: Replica, admin: str, version: str) -> None:
    deadline = time.monotonic() + 20
    while policy_version(replica, admin) != version:
        assert time.monotonic() < deadline, f"{replica.name} kept its old policy"
        time.sleep(0.1)


def test_an_edit_in_the_shared_policy_folder_applies_on_both_replicas(pair: Pair) -> None:
    path = pair.policy_dir / "edited.yaml"
    old = load_policy(path).version
    database = make_db_engine(pair.database_url)
    user, _ = create_key(make_session_factory(database), pair.edited_tenant, "user")
    database.dispose()
    message = f"Tell me about the {BLOCKED_WORDS}."
    before = [pair.chat(r, user, message) for r in (pair.a, pair.b)]
    assert [r.status_code for r in before] == [200, 200], [r.text for r in before]

    # As a ConfigMap update lands: the new file replaces the old one in one rename.
    edit = pair.policy_dir / ".edited.yaml.new"
    edit.write_text(
        policy_text(
            "edited",
            pair.edited_tenant,
            f"input:\n  injection:\n    extra_patterns: ['{BLOCKED_WORDS}']\n",
        )
    )
    os.replace(edit, path)
    new = load_policy(path).version
    for replica in (pair.b, pair.a):
        wait_for_version(replica, pair.edited_admin, new)
    after = [pair.chat(r, user, message) for r in (pair.b, pair.a)]

    for response in after:
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "content_policy_violation"
        assert response.headers["x-should-retry"] == "false"
    versions = {r.request_id: r.policy_version for r in pair.audit_rows()}
    ids = [r.headers["x-request-id"] for r in before + after]
    assert [versions[i] for i in ids] == [old, old, new, new]


def search(replica: Replica, key: str, mode: str) -> set[str]:
    found = httpx.post(
        f"{replica.base_url}/documents/search",
        headers=bearer(key),
        json={"query": LOCKER_QUESTION, "top_k": 3, "min_score": 0.1, "mode": mode},
        timeout=60,
    )
    assert found.status_code == 200, found.text
    return {hit["document_id"] for hit in found.json()["data"]}


def cited(pair: Pair, replica: Replica) -> set[str]:
    answer = pair.chat(replica, pair.user, LOCKER_QUESTION)
    assert answer.status_code == 200, answer.text
    return {c["document_id"] for c in answer.json()["citations"]}


def upload(replica: Replica, admin: str, name: str, content: bytes) -> str:
    uploaded = httpx.post(
        f"{replica.base_url}/documents",
        headers=bearer(admin),
        files={"file": (name, content, "text/markdown")},
        data={"collection": "docs"},
        timeout=60,
    )
    assert uploaded.status_code == 201, uploaded.text
    return str(uploaded.json()["id"])


def test_a_document_ingested_on_one_replica_is_cited_by_the_other_until_deleted(
    pair: Pair,
) -> None:
    # B has searched the collection before: its index is open when A adds to it.
    upload(pair.b, pair.admin, "canteen.md", SEED_DOC)
    assert search(pair.b, pair.user, "dense")
    document_id = upload(pair.a, pair.admin, "kayaks.md", LOCKER_DOC)

    assert document_id in cited(pair, pair.b)
    # Dense retrieval too, not only the lexical index (which reads the database).
    assert document_id in search(pair.b, pair.user, "dense")

    deleted = httpx.delete(
        f"{pair.b.base_url}/documents/{document_id}", headers=bearer(pair.admin), timeout=30
    )
    assert deleted.status_code == 200, deleted.text
    assert document_id not in cited(pair, pair.a)
    assert document_id not in search(pair.a, pair.user, "hybrid")
    gone = httpx.get(
        f"{pair.a.base_url}/documents/{document_id}", headers=bearer(pair.admin), timeout=30
    )
    assert gone.status_code == 404


def test_both_replicas_write_one_verifiable_audit_chain_with_one_record_a_request(
    pair: Pair,
) -> None:
    # Answers and refusals (a wrong key), sent to both replicas at once.
    calls = [(r, key) for r in (pair.a, pair.b) for key in (pair.user, "bst_wrong")] * 3
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        responses = list(pool.map(lambda call: pair.chat(*call), calls))
    assert sorted({r.status_code for r in responses}) == [200, 401]

    rows = pair.audit_rows()
    database = make_db_engine(pair.database_url)
    try:
        report = verify_chain(make_session_factory(database))
    finally:
        database.dispose()
    assert report.ok, report.problems
    assert report.records == len(rows)
    per_request: dict[str, int] = {}
    for row in rows:
        per_request[row.request_id] = per_request.get(row.request_id, 0) + 1
    assert {i: per_request.get(i, 0) for i in pair.sent} == dict.fromkeys(pair.sent, 1)
    for replica in (pair.b, pair.a):
        verified = httpx.get(
            f"{replica.base_url}/audit/verify", headers=bearer(pair.auditor), timeout=60
        ).json()
        assert verified["ok"] is True, verified["problems"]
        assert (verified["records"], verified["head_hash"]) == (report.records, report.head_hash)
