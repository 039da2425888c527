"""A streamed chat answer that contains an email address never shows it, in any chunk,
through the real model, the live app and the official `openai` client.

The output checks run a chunk at a time; the held-back window must keep every piece of the
address back until it is whole and redacted. The tenant's policy lets email addresses and
phone numbers through the input checks, so the model sees them and copies them into its
answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import yaml
from openai import OpenAI

from tests.integration.conftest import LiveServer, tenant_client

pytestmark = pytest.mark.slow

ADDRESS = "jane.roe@example.com"
# SmolLM2 copies a sentence it is asked to correct, address and all (greedy).
PHONE = "555 123 4567"  # spans words: only the window keeps its start back
QUESTION = (
    f"Correct the spelling: Plese contakt {ADDRESS} or cal {PHONE} for help with the "
    "forms, she wil anser all your questons abuot the new acount before Friday."
)
PIECES = ("jane.roe", "jane", "roe@", "example.com", "@example", "555", "123", "4567")


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[OpenAI]:
    """A client of a fresh tenant whose policy allows addresses and numbers in, not out."""
    name = f"stream-redaction-{uuid.uuid4().hex[:8]}"
    policy = yaml.safe_load((live_server.settings.policy_dir / "default.yaml").read_text())
    policy["name"], policy["applies_to"] = name, {"tenants": [name]}
    policy["input"]["pii"]["actions"] = {"EMAIL_ADDRESS": "allow", "PHONE_NUMBER": "allow"}
    policy["retrieval"]["enabled"] = False
    with tenant_client(live_server, name, yaml.safe_dump(policy)) as client:
        yield client


def test_a_streamed_answer_never_shows_the_address(client: OpenAI, live_server: LiveServer) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=live_server.engine.model_id,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=64,
        temperature=0,
        stream=True,
    )
    chunks = [c.choices[0].delta.content or "" for c in raw.parse() if c.choices]
    texts = [c for c in chunks if c]
    answer = "".join(texts)
    # The model did write the address: its placeholder stands where it was.
    assert "<EMAIL_ADDRESS_1>" in answer and "<PHONE_NUMBER_1>" in answer, answer
    for piece in PIECES:
        assert not any(piece in text for text in texts), (piece, texts)
        assert piece not in answer
    # Streamed in several chunks, with text released before and after the address.
    at = next(i for i, text in enumerate(texts) if "<EMAIL_ADDRESS_1>" in text)
    assert 0 < at < len(texts) - 1, texts
    request_id = raw.headers["x-request-id"]
    assert live_server.engine.received[request_id][-1].content == QUESTION
    (row,) = live_server.audit_rows(request_id)
    (verdict,) = [v for v in row.verdicts if v["check"] == "pii"][-1:]
    assert verdict["action"] == "redact"
    assert {"EMAIL_ADDRESS", "PHONE_NUMBER"} <= set(verdict["evidence"])
