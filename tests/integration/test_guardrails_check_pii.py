"""PII through `POST /v1/guardrails/check` on a live server: a policy's own recognizer
redacts its entity, and a pseudonymised value is replaced in the text the model gets and
restored in the answer of a chat completion on the same policy."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from engine import GenerationRequest, PagedEngine, TokenDelta
from gateway.keys.store import create_key
from gateway.services import load_services
from gateway.settings import REPO_ROOT, Settings
from tests.integration.conftest import LiveServer, RecordingEngine, wait_for_policy
from tests.support.local_server import free_port, serve_in_thread

PATH = "/v1/guardrails/check"
ADDRESS = "jane.doe@example.com"
EMPLOYEE_ID = "EMP-204871"

CUSTOM_PII = """    custom_recognizers:
      - entity: EMPLOYEE_ID
        patterns: ['\\bEMP-\\d{6}\\b']
        context: [employee]
        score: 0.7
"""
PSEUDONYMISE = "    actions: {EMAIL_ADDRESS: pseudonymize}\n"


def _policy(default: str, name: str, input_pii: str) -> str:
    """The default policy for tenant `name`, with `input_pii` added to its input PII checks."""
    policy = (
        default.replace("name: default", f"name: {name}")
        .replace("[default]", f"[{name}]")
        .replace("retrieval:\n  enabled: true", "retrieval:\n  enabled: false")
        .replace(
            "    score_threshold: 0.4\n  topics:", f"    score_threshold: 0.4\n{input_pii}  topics:"
        )
    )
    assert input_pii in policy and "enabled: false\n  collections" in policy
    return policy


def _check(base_url: str, key: str, text: str) -> dict[str, Any]:
    response = httpx.post(
        f"{base_url}{PATH}",
        json={"text": text},
        headers={"authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture(scope="module")
def custom_key(live_server: LiveServer) -> Iterator[str]:
    """An admin key of a tenant whose policy defines an EMPLOYEE_ID recognizer."""
    name = f"hr-{uuid.uuid4().hex[:8]}"
    default = (live_server.settings.policy_dir / "default.yaml").read_text()
    path = live_server.settings.policy_dir / f"{name}.yaml"
    path.write_text(_policy(default, name, CUSTOM_PII))
    try:
        wait_for_policy(live_server.services.policies, name)
        yield create_key(live_server.services.sessions, name, "admin")[0]
    finally:
        path.unlink()


def test_a_policy_recognizer_redacts_its_entity_through_the_endpoint(
    live_server: LiveServer, custom_key: str
) -> None:
    body = _check(live_server.base_url, custom_key, f"Reset the laptop of employee {EMPLOYEE_ID}.")
    assert body["decision"] == "redact"
    assert body["text"] == "Reset the laptop of employee <EMPLOYEE_ID_1>."
    (pii,) = [v for v in body["verdicts"] if v["check"] == "pii"]
    assert pii["action"] == "redact"
    assert EMPLOYEE_ID not in str(body)
    # The built-in entities still apply beside the policy's own.
    both = _check(
        live_server.base_url, custom_key, f"Mail the payslip of {EMPLOYEE_ID} to {ADDRESS}."
    )
    assert both["text"] == "Mail the payslip of <EMPLOYEE_ID_1> to <EMAIL_ADDRESS_1>.", both


class EchoEngine(RecordingEngine):
    """The real engine for everything but generation: the answer is the last message the
    model received, so what the guardrails gave the model comes back to the client."""

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        self.received[request.request_id] = request.messages
        text = request.messages[-1].content
        yield TokenDelta(text, completion_tokens=len(text.split()), prompt_tokens=1)
        yield TokenDelta("", completion_tokens=0, prompt_tokens=1, finish_reason="stop")


@pytest.fixture(scope="module")
def echo_server(
    tmp_path_factory: pytest.TempPathFactory, chat_engine: PagedEngine
) -> Iterator[tuple[str, str, EchoEngine]]:
    """A live server whose default tenant pseudonymises email addresses in prompts:
    (base URL, admin key, engine)."""
    policy_dir = tmp_path_factory.mktemp("pseudonym-policies")
    shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
    default = (policy_dir / "default.yaml").read_text()
    (policy_dir / "default.yaml").write_text(_policy(default, "default", PSEUDONYMISE))
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("pseudonym-data"), port=free_port(), policy_dir=policy_dir
    )
    engine = EchoEngine(chat_engine)
    services = load_services(settings, engine=engine)
    key, _ = create_key(services.sessions, settings.default_tenant, "admin")
    with serve_in_thread(settings, services) as base_url:
        yield base_url, key, engine


def test_a_pseudonym_reaches_the_model_and_the_original_comes_back(
    echo_server: tuple[str, str, EchoEngine],
) -> None:
    base_url, key, engine = echo_server
    question = f"Please write to {ADDRESS} about the renewal."
    body = _check(base_url, key, question)
    assert body["decision"] == "redact"
    assert body["text"] == "Please write to <EMAIL_ADDRESS_1> about the renewal."
    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=engine.model_id, messages=[{"role": "user", "content": question}], max_tokens=32
    )
    received = engine.received[raw.headers["x-request-id"]][-1].content
    assert received == body["text"]  # the model saw what the check endpoint showed
    assert raw.parse().choices[0].message.content == question
