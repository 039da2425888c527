"""Two tenants with policies on one live server: neither reaches the other's data.

Documents, retrieved chunks and citations, audit records, and cached prefix blocks in the
engine all stay with the tenant that made them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from engine import PagedEngine
from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer, wait_for_policy

SECRET_FACT = b"""# Zephyrine Project Handbook

## Locker codes
The Zephyrine team's equipment locker opens with the code 4471-QX. Only Zephyrine staff
may use it; the code changes every quarter.
"""


@dataclass(frozen=True)
class Tenant:
    name: str
    user: str
    admin: str
    auditor: str
    user_key_id: str

    def headers(self, role: str = "user") -> dict[str, str]:
        return {"authorization": f"Bearer {getattr(self, role)}"}


def make_tenant(live_server: LiveServer, name: str) -> Tenant:
    sessions = live_server.services.sessions
    keys = {role: create_key(sessions, name, role) for role in ("user", "admin", "auditor")}
    return Tenant(
        name, keys["user"][0], keys["admin"][0], keys["auditor"][0], keys["user"][1].key_id
    )


@pytest.fixture(scope="module")
def tenants(live_server: LiveServer) -> Iterator[tuple[Tenant, Tenant]]:
    """The default tenant and a second one (fresh name) whose policy is bound while we run."""
    name = f"globex-{uuid.uuid4().hex[:8]}"
    policy_dir = live_server.settings.policy_dir
    text = (policy_dir / "default.yaml").read_text()
    second = policy_dir / f"{name}.yaml"
    second.write_text(
        text.replace("name: default", f"name: {name}").replace("[default]", f"[{name}]")
    )
    wait_for_policy(live_server.services.policies, name)
    try:
        yield (
            make_tenant(live_server, live_server.settings.default_tenant),
            make_tenant(live_server, name),
        )
    finally:
        second.unlink()


def chat(live_server: LiveServer, tenant: Tenant, messages: list[dict[str, str]]) -> Any:
    response = httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        headers=tenant.headers(),
        json={"messages": messages, "max_tokens": 2, "temperature": 0},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response


def test_documents_chunks_and_citations_stay_with_their_tenant(
    live_server: LiveServer, tenants: tuple[Tenant, Tenant]
) -> None:
    owner, outsider = tenants
    base = live_server.base_url
    uploaded = httpx.post(
        f"{base}/documents",
        headers=owner.headers("admin"),
        files={"file": ("zephyrine.md", SECRET_FACT, "text/markdown")},
        timeout=60,
    )
    assert uploaded.status_code == 201, uploaded.text
    document_id = uploaded.json()["id"]
    question = [{"role": "user", "content": "What is the Zephyrine equipment locker code?"}]

    mine = chat(live_server, owner, question)
    assert document_id in {c["document_id"] for c in mine.json()["citations"]}

    theirs = chat(live_server, outsider, question)
    assert document_id not in {c["document_id"] for c in theirs.json()["citations"]}
    prompt = live_server.engine.received[theirs.headers["x-request-id"]]
    assert not any("4471-QX" in message.content for message in prompt)

    found = httpx.post(
        f"{base}/documents/search",
        headers=outsider.headers(),
        json={"query": "Zephyrine locker code", "top_k": 5},
        timeout=60,
    )
    assert found.status_code == 200
    assert document_id not in {hit["document_id"] for hit in found.json()["data"]}
    for method in ("GET", "DELETE"):
        response = httpx.request(
            method, f"{base}/documents/{document_id}", headers=outsider.headers("admin")
        )
        assert response.status_code == 404
    still_there = httpx.get(f"{base}/documents/{document_id}", headers=owner.headers("admin"))
    assert still_there.status_code == 200


def test_audit_records_stay_with_their_tenant(
    live_server: LiveServer, tenants: tuple[Tenant, Tenant]
) -> None:
    owner, outsider = tenants
    base = live_server.base_url
    request_id = chat(live_server, owner, [{"role": "user", "content": "Hi."}]).headers[
        "x-request-id"
    ]
    owners_view = httpx.get(
        f"{base}/audit/records",
        headers=owner.headers("auditor"),
        params={"key_id": owner.user_key_id},
        timeout=60,
    ).json()["data"]
    record = next(r for r in owners_view if r["request_id"] == request_id)

    outsiders_view = httpx.get(
        f"{base}/audit/records", headers=outsider.headers("auditor"), timeout=60
    )
    assert outsiders_view.status_code == 200
    assert {r["tenant"] for r in outsiders_view.json()["data"]} <= {outsider.name}
    single = httpx.get(
        f"{base}/audit/records/{record['seq']}", headers=outsider.headers("auditor"), timeout=60
    )
    assert single.status_code == 404
    asked_for_other = httpx.get(
        f"{base}/audit/records",
        headers=outsider.headers("auditor"),
        params={"tenant": owner.name},
        timeout=60,
    )
    assert asked_for_other.status_code == 403
    assert asked_for_other.json()["error"]["code"] == "tenant_mismatch"


def test_cached_prefix_blocks_are_never_shared_across_tenants(
    live_server: LiveServer, tenants: tuple[Tenant, Tenant], chat_engine: PagedEngine
) -> None:
    owner, outsider = tenants
    long_context = "Background for this conversation: " + " ".join(
        f"item {i} is stored on shelf {i % 17}." for i in range(60)
    )
    messages = [
        {"role": "system", "content": long_context},
        {"role": "user", "content": f"Which shelf holds item 7? ({uuid.uuid4().hex})"},
    ]

    def hits_of(tenant: Tenant) -> int:
        before = chat_engine.metrics().prefix_cache_hit_tokens
        chat(live_server, tenant, messages)
        return chat_engine.metrics().prefix_cache_hit_tokens - before

    hits_of(owner)
    owner_again = hits_of(owner)
    assert owner_again > 400  # the same tenant reuses the whole long prefix
    # The other tenant may reuse its own cached template head, never the owner's blocks.
    assert hits_of(outsider) < owner_again - 300
