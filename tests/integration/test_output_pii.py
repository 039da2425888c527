"""PII the model writes is filtered from its answer, whole or streamed, through the real
model and the official client.

The tenant's policy lets email addresses through the input checks (action `allow`), so
the model sees one and repeats it; the output checks (redact, the default) must keep it
from the client in every chunk, and the audit record must say they did.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from tests.integration.conftest import LiveServer, tenant_client

ADDRESS = "jane.doe@example.com"
QUESTION = f"Correct the spelling: Plese contakt {ADDRESS} for help."


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[OpenAI]:
    """A client of a fresh tenant whose policy allows email addresses in, not out."""
    name = f"initech-{uuid.uuid4().hex[:8]}"
    default = (live_server.settings.policy_dir / "default.yaml").read_text()
    policy = (
        default.replace("name: default", f"name: {name}")
        .replace("[default]", f"[{name}]")
        .replace(
            "    score_threshold: 0.4\n  topics:",
            "    score_threshold: 0.4\n    actions: {EMAIL_ADDRESS: allow}\n  topics:",
        )
        .replace("retrieval:\n  enabled: true", "retrieval:\n  enabled: false")
    )
    assert "EMAIL_ADDRESS: allow" in policy and "enabled: false\n  collections" in policy
    with tenant_client(live_server, name, policy) as client:
        yield client


def _output_pii_verdict(live_server: LiveServer, request_id: str) -> dict[str, Any]:
    """The answer's PII verdict: the output checks run after the input checks."""
    (row,) = live_server.audit_rows(request_id)
    return [v for v in row.verdicts if v["check"] == "pii"][-1]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_answer_never_shows_the_address(
    client: OpenAI, live_server: LiveServer, stream: bool
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=live_server.engine.model_id,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=24,
        temperature=0,
        stream=stream,
    )
    if stream:
        pieces = [chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices]
    else:
        pieces = [raw.parse().choices[0].message.content or ""]
    assert not any(ADDRESS in piece for piece in pieces)
    assert ADDRESS not in "".join(pieces)
    assert "<EMAIL_ADDRESS" in "".join(pieces)
    request_id = raw.headers["x-request-id"]
    assert live_server.engine.received[request_id][-1].content == QUESTION
    verdict = _output_pii_verdict(live_server, request_id)
    assert verdict["action"] == "redact" and "EMAIL_ADDRESS" in verdict["evidence"]
