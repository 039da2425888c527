"""An admin action over HTTP is audited under the request's own id, naming the admin's key
and the status answered (gateway/audit/entries.py)."""

from __future__ import annotations

import httpx

from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer


def test_an_admin_action_is_recorded_under_its_request_id(live_server: LiveServer) -> None:
    secret, admin = create_key(live_server.services.sessions, "default", "admin")
    headers = {"authorization": f"Bearer {secret}", "x-request-id": "req-admin-audit-1"}
    created = httpx.post(
        f"{live_server.base_url}/admin/keys", json={"role": "user"}, headers=headers, timeout=30
    )
    assert created.status_code == 201, created.text
    assert created.headers["x-request-id"] == "req-admin-audit-1"
    [record] = live_server.audit_rows("req-admin-audit-1")
    assert record.event == "admin.key_created"
    assert (record.endpoint, record.status_code, record.outcome) == ("/admin/keys", 201, "ok")
    assert (record.tenant, record.key_id) == ("default", admin.key_id)
    assert record.details["actor"] == f"key:{admin.key_id}"
    assert record.details["key"] == created.json()["id"]
    assert secret not in str(record.details)

    headers["x-request-id"] = "req-admin-audit-2"
    revoked = httpx.delete(
        f"{live_server.base_url}/admin/keys/{created.json()['id']}", headers=headers, timeout=30
    )
    assert revoked.status_code == 200, revoked.text
    [record] = live_server.audit_rows("req-admin-audit-2")
    assert (record.event, record.status_code) == ("admin.key_revoked", 200)
