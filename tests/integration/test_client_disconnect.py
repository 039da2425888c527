"""A client that hangs up mid-stream frees its engine blocks at once, and its request is
audited as cancelled."""

from __future__ import annotations

import time

import httpx

from tests.integration.conftest import LiveServer
from tests.integration.test_metrics import metric
from tests.integration.test_policy_reload import wait_for

MAX_TOKENS = 400


def engine_field(base_url: str, field: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return metric(text, "bastion_engine", field=field)


def test_disconnect_mid_stream_frees_blocks_at_once(live_server: LiveServer) -> None:
    base = live_server.base_url
    body = {
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {live_server.api_key}"}
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", headers=headers, json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        lines = response.iter_lines()
        next(line for line in lines if '"content":' in line and '"role"' not in line)
        assert engine_field(base, "running") == 1
        assert engine_field(base, "kv_blocks_used") > 0
    hung_up = time.monotonic()  # leaving the block closed the connection

    wait_for(lambda: engine_field(base, "kv_blocks_used") == 0, timeout=5)
    freed_after = time.monotonic() - hung_up
    assert engine_field(base, "running") == 0
    assert engine_field(base, "waiting") == 0
    assert freed_after < 5

    wait_for(lambda: bool(live_server.audit_rows(request_id)))
    (row,) = live_server.audit_rows(request_id)
    assert (row.outcome, row.status_code) == ("cancelled", 499)
    assert 0 < row.completion_tokens < MAX_TOKENS
