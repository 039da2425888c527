"""The document API over HTTP: upload, search, list, get, delete; tenants stay apart."""

from __future__ import annotations

import httpx
import pytest

from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer

POLICY_DOC = b"""# Northwind Bicycle Policy

## Bike lockers
Employees who cycle to work can rent a bike locker in the basement for 5 EUR a month.
Ask facilities for a locker key; the waiting list is about two weeks.
"""


@pytest.fixture(scope="module")
def admin(live_server: LiveServer) -> dict[str, str]:
    secret, _ = create_key(live_server.services.sessions, "default", "admin")
    return {"authorization": f"Bearer {secret}"}


def search(live_server: LiveServer, headers: dict[str, str], query: str) -> httpx.Response:
    return httpx.post(
        f"{live_server.base_url}/documents/search",
        headers=headers,
        json={"query": query, "top_k": 3, "min_score": 0.1},
        timeout=60,
    )


def cited(live_server: LiveServer, headers: dict[str, str], question: str) -> set[str]:
    """The document ids a chat answer cites."""
    response = httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        headers=headers,
        json={"messages": [{"role": "user", "content": question}], "max_tokens": 2},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return {c["document_id"] for c in response.json()["citations"]}


def test_upload_search_list_get_delete(live_server: LiveServer, admin: dict[str, str]) -> None:
    base = live_server.base_url
    uploaded = httpx.post(
        f"{base}/documents",
        headers=admin,
        files={"file": ("bicycles.md", POLICY_DOC, "text/markdown")},
        data={"collection": "docs"},
        timeout=60,
    )
    assert uploaded.status_code == 201, uploaded.text
    document_id = uploaded.json()["id"]
    assert uploaded.json()["status"] == "created" and uploaded.json()["chunks"] >= 1

    user = {"authorization": f"Bearer {live_server.api_key}"}
    hits = search(live_server, user, "where can I store my bike at the office?").json()["data"]
    assert hits and hits[0]["document_id"] == document_id
    assert document_id in cited(live_server, user, "Where can I store my bike at the office?")
    assert hits[0]["title"] == "Northwind Bicycle Policy"

    listing = httpx.get(f"{base}/documents", headers=admin, timeout=30).json()["data"]
    assert document_id in {d["id"] for d in listing}
    one = httpx.get(f"{base}/documents/{document_id}", headers=admin, timeout=30)
    assert one.status_code == 200 and one.json()["source"] == "bicycles.md"

    assert (
        httpx.delete(f"{base}/documents/{document_id}", headers=admin, timeout=30).status_code
        == 200
    )
    after = search(live_server, user, "where can I store my bike at the office?").json()["data"]
    assert document_id not in {h["document_id"] for h in after}
    assert document_id not in cited(live_server, user, "Where can I store my bike at the office?")
    assert (
        httpx.get(f"{base}/documents/{document_id}", headers=admin, timeout=30).status_code == 404
    )


def test_another_tenant_never_sees_the_documents(
    live_server: LiveServer, admin: dict[str, str]
) -> None:
    uploaded = httpx.post(
        f"{live_server.base_url}/documents",
        headers=admin,
        files={"file": ("lockers.md", POLICY_DOC, "text/markdown")},
        timeout=60,
    ).json()
    outsider, _ = create_key(live_server.services.sessions, "globex", "admin")
    headers = {"authorization": f"Bearer {outsider}"}
    response = search(live_server, headers, "bike locker rent")
    # globex has no policy bound: refused outright (fail closed)
    assert response.status_code == 403
    assert (
        httpx.get(
            f"{live_server.base_url}/documents/{uploaded['id']}", headers=headers, timeout=30
        ).status_code
        == 404
    )
    listing = httpx.get(f"{live_server.base_url}/documents", headers=headers, timeout=30)
    assert listing.json()["data"] == []


def test_bad_uploads_get_clear_errors(live_server: LiveServer, admin: dict[str, str]) -> None:
    base = live_server.base_url
    wrong_type = httpx.post(f"{base}/documents", headers=admin, json={"x": 1}, timeout=30)
    assert wrong_type.status_code == 415
    binary = httpx.post(
        f"{base}/documents",
        headers=admin,
        files={"file": ("image.png", b"\x89PNG\r\n\x1a\n\x00\x00", "image/png")},
        timeout=30,
    )
    assert binary.status_code == 400 and binary.json()["error"]["param"] == "file"
    bad_search = httpx.post(
        f"{base}/documents/search", headers=admin, json={"query": ""}, timeout=30
    )
    assert bad_search.status_code == 400 and bad_search.json()["error"]["param"] == "query"
