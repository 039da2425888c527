"""Every route checks the caller's role: a table over all routes of the live app."""

from __future__ import annotations

import re

import httpx
import pytest

from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer

# Which roles may call each area; a route outside every area fails the test, so new
# routes must be placed here.
ALLOWED_ROLES = {
    # user keys too where their policy allows it (the default policy does not)
    "/v1/guardrails/": {"admin"},
    "/v1/": {"user", "admin"},
    "/documents/search": {"user", "admin"},
    "/documents": {"admin"},
    "/admin/": {"admin"},
    "/audit/": {"auditor"},
}
PUBLIC = {"/healthz", "/readyz", "/audit/ui", "/metrics"}
ROLES = ("user", "admin", "auditor")


@pytest.fixture(scope="module")
def keys(live_server: LiveServer) -> dict[str, str]:
    sessions = live_server.services.sessions
    return {role: create_key(sessions, "default", role)[0] for role in ROLES}


def routes(live_server: LiveServer) -> list[tuple[str, str]]:
    found = []
    schema = httpx.get(f"{live_server.base_url}/schema/openapi.json", timeout=10).json()
    for path, operations in schema["paths"].items():
        for method in operations:
            if method.upper() in ("GET", "POST", "DELETE", "PUT", "PATCH"):
                found.append((method.upper(), path))
    return found


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path)


def area(path: str) -> set[str] | None:
    return next((roles for prefix, roles in ALLOWED_ROLES.items() if path.startswith(prefix)), None)


def test_every_route_checks_roles(live_server: LiveServer, keys: dict[str, str]) -> None:
    checked = 0
    for method, path in routes(live_server):
        if path in PUBLIC or path.startswith("/schema"):
            continue
        allowed = area(path)
        assert allowed is not None, f"{method} {path} is in no role area: add it to the table"
        url = f"{live_server.base_url}{concrete(path)}"
        anonymous = httpx.request(method, url, json={}, timeout=60)
        assert anonymous.status_code == 401, (method, path, anonymous.status_code)
        for role in ROLES:
            response = httpx.request(
                method, url, json={}, timeout=120, headers={"authorization": f"Bearer {keys[role]}"}
            )
            if role in allowed:
                assert response.status_code not in (401, 403), (method, path, role, response.text)
            else:
                assert response.status_code == 403, (method, path, role, response.status_code)
                assert response.json()["error"]["type"] == "permission_error"
        checked += 1
    assert checked >= 8


def test_an_admin_cannot_touch_another_tenants_keys(live_server: LiveServer) -> None:
    sessions = live_server.services.sessions
    _, victim = create_key(sessions, "default", "user")
    other_admin, _ = create_key(sessions, "globex", "admin")
    response = httpx.delete(
        f"{live_server.base_url}/admin/keys/{victim.key_id}",
        headers={"authorization": f"Bearer {other_admin}"},
        timeout=30,
    )
    assert response.status_code == 404
    listing = httpx.get(
        f"{live_server.base_url}/admin/keys",
        headers={"authorization": f"Bearer {other_admin}"},
        timeout=30,
    ).json()
    assert all(k["tenant"] == "globex" for k in listing["data"])


def test_admin_key_lifecycle_over_http(live_server: LiveServer, keys: dict[str, str]) -> None:
    admin = {"authorization": f"Bearer {keys['admin']}"}
    base = live_server.base_url
    created = httpx.post(
        f"{base}/admin/keys",
        json={"role": "user", "requests_per_minute": 5},
        headers=admin,
        timeout=30,
    )
    assert created.status_code == 201, created.text
    new_key, new_id = created.json()["key"], created.json()["id"]
    assert (
        httpx.get(
            f"{base}/v1/models", headers={"authorization": f"Bearer {new_key}"}, timeout=30
        ).status_code
        == 200
    )
    rotated = httpx.post(
        f"{base}/admin/keys/{new_id}/rotate", json={}, headers=admin, timeout=30
    ).json()
    assert rotated["replaces"] == new_id
    assert (
        httpx.get(
            f"{base}/v1/models", headers={"authorization": f"Bearer {new_key}"}, timeout=30
        ).status_code
        == 401
    )
    assert (
        httpx.delete(f"{base}/admin/keys/{rotated['id']}", headers=admin, timeout=30).status_code
        == 200
    )
    assert (
        httpx.get(
            f"{base}/v1/models", headers={"authorization": f"Bearer {rotated['key']}"}, timeout=30
        ).status_code
        == 401
    )
    bad = httpx.post(f"{base}/admin/keys", json={"role": "root"}, headers=admin, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "role"
