"""A key's token budget is charged with each answer's tokens, streamed or not, and a key
whose minute's budget is spent is refused with 429 before the engine runs."""

from __future__ import annotations

import httpx
import pytest

from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer

MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_spent_token_budget_refuses_the_next_request(
    live_server: LiveServer, stream: bool
) -> None:
    secret, _ = create_key(live_server.services.sessions, "default", "user", tokens_per_minute=20)
    headers = {"authorization": f"Bearer {secret}"}
    url = f"{live_server.base_url}/v1/chat/completions"
    body = {"messages": MESSAGES, "max_tokens": 4, "stream": stream}
    first = httpx.post(url, json=body, headers=headers, timeout=60)
    assert first.status_code == 200, first.text
    if stream:
        assert first.text.rstrip().endswith("data: [DONE]")
    second = httpx.post(url, json=body, headers=headers, timeout=60)
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "rate_limit_exceeded"
    assert "tokens per minute" in second.json()["error"]["message"]
