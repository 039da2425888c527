"""`POST /admin/keys` answers with `warnings` when no policy binds the tenant of the new
key (its requests would all be refused 403), and logs it without the secret."""

from __future__ import annotations

import httpx
from structlog.testing import capture_logs

from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer


def _create_user_key(live_server: LiveServer, tenant: str) -> httpx.Response:
    secret, _ = create_key(live_server.services.sessions, tenant, "admin")
    response = httpx.post(
        f"{live_server.base_url}/admin/keys",
        json={"role": "user"},
        headers={"authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return response


def test_a_key_for_an_unbound_tenant_comes_with_a_warning(live_server: LiveServer) -> None:
    with capture_logs() as logs:
        created = _create_user_key(live_server, "initech")
    body = created.json()
    folder = live_server.settings.policy_dir
    assert body["tenant"] == "initech"
    assert body["warnings"] == [
        f"No policy binds tenant 'initech': add it to `applies_to.tenants` of a policy in "
        f"{folder}. Until then every request with this key is refused (403)."
    ]
    [record] = [r for r in logs if r["event"] == "keys.tenant_unbound"]
    assert record["log_level"] == "warning"
    assert (record["tenant"], record["key_id"]) == ("initech", body["id"])
    assert body["key"] not in str(record)
    # The warning is true: the new key's requests are refused.
    chat = httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        json={"model": "bastion", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {body['key']}"},
        timeout=30,
    )
    assert chat.status_code == 403
    assert "No policy is bound to tenant 'initech'" in chat.text


def test_a_key_for_a_bound_tenant_has_no_warnings(live_server: LiveServer) -> None:
    with capture_logs() as logs:
        created = _create_user_key(live_server, live_server.settings.default_tenant)
    assert created.json()["warnings"] == []
    assert not [r for r in logs if r["event"] == "keys.tenant_unbound"]
