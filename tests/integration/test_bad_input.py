"""Bad input gets a clear OpenAI-shaped 4xx, never a 500, and is audited once."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.db.models import AuditRecord
from gateway.http.request_limits import MAX_HEADER_BYTES
from gateway.keys.store import create_key
from gateway.settings import REPO_ROOT
from tests.integration.conftest import LiveServer

GOOD_MESSAGES = [{"role": "user", "content": "hi"}]


def tool(name: str, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


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


def assert_audited_once(live_server: LiveServer, response: httpx.Response) -> AuditRecord:
    """The request left exactly one audit record, with the status the client got."""
    rows = live_server.audit_rows(response.headers["x-request-id"])
    assert len(rows) == 1, rows
    assert rows[0].status_code == response.status_code
    return rows[0]


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
        (
            "max_tokens above the policy",
            {"messages": GOOD_MESSAGES, "max_tokens": 10**30},
            None,
            "max_tokens",
        ),
        (
            "zero max_completion_tokens",
            {"messages": GOOD_MESSAGES, "max_completion_tokens": 0},
            None,
            "max_completion_tokens",
        ),
        ("n of zero", {"messages": GOOD_MESSAGES, "n": 0}, None, "n"),
        ("n above the policy limit", {"messages": GOOD_MESSAGES, "n": 5}, None, "n"),
        ("seed beyond 64 bits", {"messages": GOOD_MESSAGES, "seed": 2**70}, None, "seed"),
        ("messages not a list", {"messages": "hi"}, None, "messages"),
        ("tools not a list", {"messages": GOOD_MESSAGES, "tools": {"a": 1}}, None, "tools"),
        (
            "tool name with spaces",
            {"messages": GOOD_MESSAGES, "tools": [tool("has spaces", {})]},
            None,
            "tools.0.function.name",
        ),
        (
            "tool parameters not an object",
            {"messages": GOOD_MESSAGES, "tools": [tool("lookup", "a string")]},
            None,
            "tools.0.function.parameters",
        ),
        (
            "tool parameters not a JSON Schema",
            {"messages": GOOD_MESSAGES, "tools": [tool("lookup", {"type": "wizard"})]},
            None,
            "tools.0.function.parameters",
        ),
        (
            "tool of an unknown type",
            {"messages": GOOD_MESSAGES, "tools": [{"type": "retrieval"}]},
            None,
            "tools.0.type",
        ),
    ],
)
def test_invalid_request_is_a_400(
    live_server: LiveServer, case: str, body: Any, raw: bytes | None, param: str | None
) -> None:
    response = post(live_server, body, raw=raw)
    assert_openai_error(response, 400, param)
    assert assert_audited_once(live_server, response).outcome == "rejected"


def test_wrong_api_key_is_a_401(live_server: LiveServer) -> None:
    response = post(live_server, {"messages": GOOD_MESSAGES}, key="bst_not-a-real-key")
    assert_openai_error(response, 401)
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert live_server.api_key not in response.text
    assert assert_audited_once(live_server, response).tenant is None


def test_missing_api_key_is_a_401(live_server: LiveServer) -> None:
    response = post(live_server, {"messages": GOOD_MESSAGES}, key=None)
    assert_openai_error(response, 401)
    assert assert_audited_once(live_server, response).tenant is None


def test_unknown_model_is_a_404(live_server: LiveServer) -> None:
    response = post(live_server, {"model": "gpt-9", "messages": GOOD_MESSAGES})
    assert_openai_error(response, 404, "model")
    assert_audited_once(live_server, response)


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
    assert_audited_once(live_server, response)


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
    assert_audited_once(live_server, response)


@pytest.mark.parametrize(
    ("content_type", "raw"),
    [
        ("text/plain", b"hello"),
        ("text/plain", b'{"messages": [{"role": "user", "content": "hi"}]}'),
        ("application/x-www-form-urlencoded", b"messages=hi"),
        ("multipart/form-data; boundary=x", b"--x--"),
    ],
)
def test_wrong_content_type_is_a_415(
    live_server: LiveServer, content_type: str, raw: bytes
) -> None:
    response = httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        headers={"authorization": f"Bearer {live_server.api_key}", "content-type": content_type},
        content=raw,
        timeout=30,
    )
    assert_openai_error(response, 415)
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert_audited_once(live_server, response)


def test_unknown_fields_are_refused_and_openai_ones_ignored(live_server: LiveServer) -> None:
    refused = post(live_server, {"messages": GOOD_MESSAGES, "frobnicate": True})
    assert_openai_error(refused, 400, "frobnicate")
    assert "Unrecognized request argument" in refused.json()["error"]["message"]
    assert assert_audited_once(live_server, refused).outcome == "rejected"
    unsupported = post(live_server, {"messages": GOOD_MESSAGES, "audio": {"voice": "alloy"}})
    assert_openai_error(unsupported, 400, "audio")
    ignored = {"store": True, "metadata": {"team": "a"}, "prompt_cache_key": "k"}
    tolerated = post(live_server, {"messages": GOOD_MESSAGES, "max_tokens": 2, **ignored})
    assert tolerated.status_code == 200, tolerated.text
    assert assert_audited_once(live_server, tolerated).outcome == "ok"


def test_a_tiny_temperature_samples_like_greedy(live_server: LiveServer) -> None:
    """Logits divided by 1e-300 overflowed to nan in the sampler: a 500 before the fix."""
    body = {"messages": GOOD_MESSAGES, "max_tokens": 2, "temperature": 1e-300}
    response = post(live_server, body)
    assert response.status_code == 200, response.text
    assert_audited_once(live_server, response)


@pytest.mark.parametrize("key", ["valid", None])
def test_headers_too_large_are_a_431(live_server: LiveServer, key: str | None) -> None:
    """uvicorn's default parser (httptools) takes headers of any size, so the app refuses
    them itself, audited like any other rejection, before authentication."""
    headers = {"x-padding": "a" * (MAX_HEADER_BYTES + 1)}
    if key is not None:
        headers["authorization"] = f"Bearer {live_server.api_key}"
    response = httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        headers=headers,
        json={"messages": GOOD_MESSAGES},
        timeout=30,
    )
    assert_openai_error(response, 431)
    assert response.json()["error"]["code"] == "headers_too_large"
    record = assert_audited_once(live_server, response)
    assert record.event == "request.rejected" and record.tenant is None


@pytest.mark.parametrize(
    ("role", "method", "path", "body", "status", "param"),
    [
        ("auditor", "GET", f"/audit/records/{2**70}", None, 404, "seq"),
        ("admin", "POST", "/admin/keys", {"role": "user", "requests_per_minute": 2**70}, 400, None),
        ("admin", "POST", "/admin/keys", {"role": "user", "tokens_per_minute": 2**31}, 400, None),
        (
            "admin",
            "POST",
            "/admin/keys",
            {"role": "user", "expires_at": "0001-01-01T00:00:00+05:00"},
            400,
            "expires_at",
        ),
    ],
)
def test_out_of_range_values_on_other_routes_are_a_4xx(
    live_server: LiveServer,
    role: str,
    method: str,
    path: str,
    body: Any,
    status: int,
    param: str | None,
) -> None:
    """Found by the fuzzer: integers past 64 bits reached SQLite (OverflowError, a 500)."""
    key, _ = create_key(live_server.services.sessions, "default", role)
    response = httpx.request(
        method,
        f"{live_server.base_url}{path}",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert_openai_error(response, status, param)
