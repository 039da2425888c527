"""The policy's switch for speculative decoding reaches the engine's request."""

from __future__ import annotations

import uuid

import httpx

from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer, wait_for_policy


def _ask(live_server: LiveServer, key: str, path: str, body: dict[str, object]) -> str:
    response = httpx.post(
        f"{live_server.base_url}{path}",
        headers={"authorization": f"Bearer {key}"},
        json={**body, "max_tokens": 2},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"]


def test_a_policy_turns_speculation_off_for_its_tenant(live_server: LiveServer) -> None:
    name = f"nospec-{uuid.uuid4().hex[:8]}"
    policy = live_server.settings.policy_dir / f"{name}.yaml"
    policy.write_text(
        f"name: {name}\napplies_to:\n  tenants: [{name}]\nmodel:\n  speculative_decoding: false\n"
    )
    try:
        wait_for_policy(live_server.services.policies, name)
        key = create_key(live_server.services.sessions, name, "user")[0]
        chat = {"messages": [{"role": "user", "content": "Hello there."}]}
        completion = {"prompt": "Once upon a time"}
        off = [
            _ask(live_server, key, "/v1/chat/completions", chat),
            _ask(live_server, key, "/v1/completions", completion),
        ]
        on = [
            _ask(live_server, live_server.api_key, "/v1/chat/completions", chat),
            _ask(live_server, live_server.api_key, "/v1/completions", completion),
        ]
    finally:
        policy.unlink()
    assert [live_server.engine.sampling[r].speculative for r in off] == [False, False]
    assert [live_server.engine.sampling[r].speculative for r in on] == [True, True]
