"""Bad input gets a clear OpenAI-shaped 4xx, never a 500, and is audited once."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.settings import REPO_ROOT
from tests.integration.conftest import LiveServer

GOOD_MESSAGES = [{"role": "user", "content": "hi"}]


def post(
    live_server: LiveServer, body: Any, *, key: str | None = "valid", raw: bytes | None = None
) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key == "valid":
        headers["authorization"] = f"Bearer {live_server.api_key}"
    elif key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        headers=headers,
        content=raw if raw is not None else None,
        json=body if raw is None else None,
        timeout=60,
    )


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert response.headers["x-request-id"]
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize(
    ("case", "body", "raw", "param"),
    [
        ("invalid json", None, b'{"messages": [', None),
        ("not an object", None, b"[1, 2]", None),
        ("missing messages", {"model": "x"}, None, "messages"),
        ("empty messages", {"messages": []}, None, "messages"),
        (
            "unknown role",
            {"messages": [{"role": "wizard", "content": "hi"}]},
            None,
            "messages.0.role",
        ),
        ("empty content", {"messages": [{"role": "user", "content": ""}]}, None, "messages.0"),
        ("blank content", {"messages": [{"role": "user", "content": "   "}]}, None, "messages.0"),
        ("zero max_tokens", {"messages": GOOD_MESSAGES, "max_tokens": 0}, None, "max_tokens"),
        ("negative max_tokens", {"messages": GOOD_MESSAGES, "max_tokens": -5}, None, "max_tokens"),
        (
            "temperature too high",
            {"messages": GOOD_MESSAGES, "temperature": 7},
            None,
            "temperature",
        ),
    ],
)
def test_invalid_request_is_a_400(
    live_server: LiveServer, case: str, body: Any, raw: bytes | None, param: str | None
) -> None:
    response = post(live_server, body, raw=raw)
    assert_openai_error(response, 400, param)
    rows = live_server.audit_rows(response.headers["x-request-id"])
    assert len(rows) == 1 and rows[0].outcome == "rejected" and rows[0].status_code == 400


def test_wrong_api_key_is_a_401(live_server: LiveServer) -> None:
    response = post(live_server, {"messages": GOOD_MESSAGES}, key="bst_not-a-real-key")
    assert_openai_error(response, 401)
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert live_server.api_key not in response.text


def test_missing_api_key_is_a_401(live_server: LiveServer) -> None:
    response = post(live_server, {"messages": GOOD_MESSAGES}, key=None)
    assert_openai_error(response, 401)
    rows = live_server.audit_rows(response.headers["x-request-id"])
    assert len(rows) == 1 and rows[0].tenant is None and rows[0].status_code == 401


def test_unknown_model_is_a_404(live_server: LiveServer) -> None:
    response = post(live_server, {"model": "gpt-9", "messages": GOOD_MESSAGES})
    assert_openai_error(response, 404, "model")


def test_unknown_route_is_an_openai_shaped_404(live_server: LiveServer) -> None:
    response = httpx.get(f"{live_server.base_url}/v1/nothing-here", timeout=10)
    assert_openai_error(response, 404)


def test_prompt_beyond_the_context_window_is_refused(live_server: LiveServer) -> None:
    long_text = (REPO_ROOT / "docs" / "sample-corpus" / "vacation-policy.md").read_text() * 60
    response = post(
        live_server, {"messages": [{"role": "user", "content": long_text}], "max_tokens": 100}
    )
    assert_openai_error(response, 400, "messages")
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_health_and_openapi(live_server: LiveServer) -> None:
    assert httpx.get(f"{live_server.base_url}/healthz", timeout=10).json() == {"status": "ok"}
    ready = httpx.get(f"{live_server.base_url}/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    schema = httpx.get(f"{live_server.base_url}/schema/openapi.json", timeout=10).json()
    assert "/v1/chat/completions" in schema["paths"]


@pytest.mark.parametrize(
    ("case", "raw", "status"),
    [
        ("invalid utf-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
        ("deeply nested json", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400),
        ("body over the size limit", b'{"messages": "' + b"x" * (11 * 1024 * 1024) + b'"}', 413),
        (
            "huge messages array",
            b'{"messages": [' + b",".join([b'{"role": "user", "content": "hi"}'] * 5000) + b"]}",
            400,
        ),
    ],
)
def test_hostile_bodies_get_a_clear_4xx(
    live_server: LiveServer, case: str, raw: bytes, status: int
) -> None:
    response = post(live_server, None, raw=raw)
    assert_openai_error(response, status)
    rows = live_server.audit_rows(response.headers["x-request-id"])
    assert len(rows) == 1 and rows[0].status_code == status


def test_wrong_content_type_and_unknown_fields(live_server: LiveServer) -> None:
    response = httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        headers={"authorization": f"Bearer {live_server.api_key}", "content-type": "text/plain"},
        content=b"hello",
        timeout=30,
    )
    assert_openai_error(response, 400)
    tolerated = post(
        live_server,
        {"messages": GOOD_MESSAGES, "max_tokens": 2, "frobnicate": True, "logit_bias": {}},
    )
    assert tolerated.status_code == 200


def test_n_above_one_and_bad_tools_are_refused(live_server: LiveServer) -> None:
    assert_openai_error(post(live_server, {"messages": GOOD_MESSAGES, "n": 3}), 400, "n")
    bad_tool = {"type": "function", "function": {"name": "has spaces", "parameters": {}}}
    assert_openai_error(
        post(live_server, {"messages": GOOD_MESSAGES, "tools": [bad_tool]}),
        400,
        "tools.0.function.name",
    )
