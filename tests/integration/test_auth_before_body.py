"""Authentication runs before the body is read: a caller without a valid key gets 401
(and a role that may not call gets 403) whatever body it sends; only a caller that may
call the route learns what is wrong with its body. Each refusal is audited once."""

from __future__ import annotations

import httpx
import pytest

from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer
from tests.integration.test_bad_input import assert_audited_once, assert_openai_error

# Each body-taking route, a role that may call it and one that may not.
ROUTES = [
    ("/v1/chat/completions", "user", "auditor"),
    ("/v1/completions", "user", "auditor"),
    ("/v1/embeddings", "user", "auditor"),
    ("/v1/guardrails/check", "admin", "user"),
    ("/admin/keys", "admin", "user"),
    ("/documents/search", "user", "auditor"),
]
BAD_BODIES = [
    (b'{"messages": [', "application/json", 400),
    (b'{"unknown_field": 1}', "application/json", 400),
    (b"plain words", "text/plain", 415),
]


@pytest.fixture(scope="module")
def keys(live_server: LiveServer) -> dict[str, str]:
    sessions = live_server.services.sessions
    return {role: create_key(sessions, "default", role)[0] for role in ("user", "admin", "auditor")}


def send(
    live_server: LiveServer, path: str, body: bytes, media: str, key: str | None
) -> httpx.Response:
    headers = {"content-type": media}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(f"{live_server.base_url}{path}", content=body, headers=headers, timeout=60)


@pytest.mark.parametrize(("path", "allowed", "refused"), ROUTES)
@pytest.mark.parametrize(("body", "media", "status"), BAD_BODIES)
def test_a_bad_body_is_judged_only_for_a_caller_who_may_send_it(
    live_server: LiveServer,
    keys: dict[str, str],
    path: str,
    allowed: str,
    refused: str,
    body: bytes,
    media: str,
    status: int,
) -> None:
    anonymous = send(live_server, path, body, media, None)
    assert_openai_error(anonymous, 401)
    assert assert_audited_once(live_server, anonymous).tenant is None
    unknown = send(live_server, path, body, media, "bst_not-a-real-key")
    assert_openai_error(unknown, 401)
    wrong_role = send(live_server, path, body, media, keys[refused])
    assert_openai_error(wrong_role, 403)
    assert_audited_once(live_server, wrong_role)
    allowed_caller = send(live_server, path, body, media, keys[allowed])
    assert_openai_error(allowed_caller, status)


def test_a_denied_chat_request_is_audited_as_the_chat_request(live_server: LiveServer) -> None:
    """The chat route audits every request itself: a denial is its one record, not an
    extra `auth.denied` one."""
    response = send(live_server, "/v1/chat/completions", b"{}", "application/json", None)
    record = assert_audited_once(live_server, response)
    assert (record.event, record.outcome, record.error_code) == (
        "chat.completion",
        "rejected",
        "invalid_api_key",
    )
