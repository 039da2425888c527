"""The access log: one record per request, written when the response has ended, so that
no answer waits for its line before its first token goes out."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from tests.integration.conftest import LiveServer


@pytest.fixture
def logged() -> Iterator[list[dict[str, Any]]]:
    """The structlog records the server writes during the test, as event dicts."""
    with capture_logs() as records:
        yield records


def access_records(logged: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    return [r for r in logged if r["event"] == "http.request" and r["request_id"] == request_id]


def written_records(logged: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    """The request's records once it has one: the server writes it just after the
    response's last bytes go out, so the client may have read them a moment before."""
    deadline = time.monotonic() + 10
    while not (found := access_records(logged, request_id)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


def test_a_streamed_answer_is_logged_once_after_it_ends(
    live_server: LiveServer, logged: list[dict[str, Any]]
) -> None:
    headers = {"authorization": f"Bearer {live_server.api_key}"}
    body = {
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 16,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        f"{live_server.base_url}/v1/chat/completions",
        headers=headers,
        json=body,
        timeout=120,
    ) as answer:
        assert answer.status_code == 200
        request_id = answer.headers["x-request-id"]
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        # The answer has begun, and its record is not written yet.
        assert access_records(logged, request_id) == []
        rest = list(lines)
    assert "data: [DONE]" in rest

    records = written_records(logged, request_id)
    assert len(records) == 1
    record = records[0]
    assert (record["method"], record["path"], record["status"]) == (
        "POST",
        "/v1/chat/completions",
        200,
    )
    assert record["duration_ms"] > 0
    assert live_server.api_key not in json.dumps(record)


def test_a_path_no_route_matches_is_logged_with_its_status(
    live_server: LiveServer, logged: list[dict[str, Any]]
) -> None:
    missing = httpx.get(f"{live_server.base_url}/v1/no-such-thing?key=secret-value", timeout=30)
    assert missing.status_code == 404

    records = written_records(logged, missing.headers["x-request-id"])
    assert [(r["path"], r["status"]) for r in records] == [("/v1/no-such-thing", 404)]
    assert "secret-value" not in json.dumps(records)  # the query string is left out
