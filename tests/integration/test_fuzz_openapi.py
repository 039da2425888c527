"""Schemathesis against Bastion's own OpenAPI document, on the live server.

Every route of the document gets generated cases, valid and invalid, with a key of a role
that may call it and without one: no 5xx, every error in the documented OpenAI shape,
every response as the document describes it, and one audit record per chat, completions
or embeddings request.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.core.transport import Response
from schemathesis.generation import GenerationMode
from schemathesis.generation.case import Case
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import func, select

from gateway.db.models import AuditRecord
from gateway.keys.store import create_key
from tests.integration.conftest import LiveServer

TENANT = "fuzz"
# Its own tenant and policy, so that generated keys, documents and audit records stay out
# of other tests' way, and a tiny answer budget keeps valid chat cases cheap.
POLICY = f"""\
name: fuzz
extends: default
applies_to:
  tenants: [{TENANT}]
model:
  max_tokens: 3
guardrails_check:
  allow_user: true
"""
ROLE_FOR_PREFIX = {
    "/v1/": "user",
    "/documents/search": "user",
    "/documents": "admin",
    "/admin/": "admin",
    "/audit/": "auditor",
}
PUBLIC = {"/healthz", "/readyz", "/metrics"}
# Generated cases per operation and mode; an operation without inputs gets one of each.
EXAMPLES = {"POST /v1/chat/completions": 60, "POST /documents": 20}
DEFAULT_EXAMPLES = 45
ANONYMOUS_EXAMPLES = 4
MIN_CASES = 1000
# Routes that leave one audit record for every request, refused or served.
AUDITED_EVERY_REQUEST = {
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/embeddings",
    "POST /v1/guardrails/check",
}
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@dataclass
class FuzzRun:
    """What the fuzzer sent and what it found."""

    cases: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    audited_ids: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def fuzz_keys(live_server: LiveServer) -> Iterator[dict[str, str]]:
    path = live_server.settings.policy_dir / "fuzz.yaml"
    path.write_text(POLICY)
    live_server.services.policies.reload(force=True)
    assert live_server.services.policies.for_tenant(TENANT) is not None
    sessions = live_server.services.sessions
    yield {role: create_key(sessions, TENANT, role)[0] for role in ("user", "admin", "auditor")}
    path.unlink()
    live_server.services.policies.reload(force=True)


def fill_blank_messages(case: Case) -> Case:
    """Blank messages are refused (400), and the document cannot say so in JSON Schema;
    filled in, valid cases get past validation to the guardrails and the engine."""
    messages = case.body.get("messages") if isinstance(case.body, dict) else None
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(message, dict) and (not isinstance(content, str) or not content.strip()):
            message["content"] = "How many vacation days do I get?"
    return case


def has_inputs(operation: APIOperation) -> bool:
    return any(
        parameters.items
        for parameters in (operation.path_parameters, operation.query, operation.body)
    )


def role_for(path: str) -> str | None:
    return next((r for prefix, r in ROLE_FOR_PREFIX.items() if path.startswith(prefix)), None)


def request_id(response: Response) -> str:
    return response.headers.get("x-request-id", [""])[0]


def error_shape_problem(response: Response) -> str | None:
    """Why a 4xx/5xx body is not `{"error": {"message", "type", "param", "code"}}`."""
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return f"not an OpenAI error body: {response.content[:200]!r}"
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
        return f"wrong error keys: {error!r}"
    if not isinstance(error["message"], str) or not error["message"]:
        return "empty error message"
    if not request_id(response):
        return "no x-request-id"
    return None


def exercise(
    operation: APIOperation,
    mode: GenerationMode,
    examples: int,
    base_url: str,
    headers: dict[str, str],
    run: FuzzRun,
    *,
    expect_status: int | None = None,
) -> None:
    """Send `examples` generated cases of `operation` and record what went wrong."""
    label = f"{operation.method.upper()} {operation.path}"
    strategy = operation.as_strategy(generation_mode=mode)
    if mode is GenerationMode.POSITIVE and operation.path == "/v1/chat/completions":
        strategy = strategy.map(fill_blank_messages)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def send(case: Case) -> None:
        response = case.call(base_url=base_url, headers=headers, timeout=60)
        run.cases[label] += 1
        run.statuses[label, response.status_code] += 1
        problems: list[str] = []
        if expect_status is not None and response.status_code != expect_status:
            problems.append(f"expected {expect_status}, got {response.status_code}")
        if response.status_code >= 400:
            shape = error_shape_problem(response)
            if shape:
                problems.append(shape)
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as exc:
            problems.append(str(exc)[:600])
        if label in AUDITED_EVERY_REQUEST or expect_status == 401:
            run.audited_ids.append(request_id(response))
        if problems:
            sent = case.body if isinstance(case.body, dict) else {}
            named = {k: v for k, v in sent.items() if k.isascii() and k.isidentifier()}
            run.failures.append(
                f"{label} [{mode}] {case.path_parameters} {case.query} {named!r:.300} "
                f"-> {response.status_code}: {problems}"
            )

    try:
        send()
    except Unsatisfiable:
        # An operation without inputs has nothing to make invalid.
        if mode is GenerationMode.POSITIVE:
            raise


def audit_counts(live_server: LiveServer, request_ids: list[str]) -> Counter[str]:
    with live_server.services.sessions() as session:
        rows = session.execute(
            select(AuditRecord.request_id, func.count())
            .where(AuditRecord.request_id.in_(request_ids))
            .group_by(AuditRecord.request_id)
        ).all()
    return Counter({request_id: count for request_id, count in rows})


@pytest.mark.slow
def test_fuzzed_requests_get_documented_answers(
    live_server: LiveServer, fuzz_keys: dict[str, str]
) -> None:
    document = httpx.get(f"{live_server.base_url}/schema/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    base_url = live_server.base_url
    run = FuzzRun()
    started = time.monotonic()
    labels = set()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the document is not valid: {result.err()}"
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        labels.add(label)
        role = role_for(operation.path)
        assert role is not None or operation.path in PUBLIC, f"{label} is in no role area"
        headers = {} if role is None else {"authorization": f"Bearer {fuzz_keys[role]}"}
        op_started = time.monotonic()
        if has_inputs(operation):
            examples = EXAMPLES.get(label, DEFAULT_EXAMPLES)
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                exercise(operation, mode, examples, base_url, headers, run)
        else:
            exercise(operation, GenerationMode.POSITIVE, 1, base_url, headers, run)
        if role is not None:
            for anonymous in ({}, {"authorization": "Bearer bst_not-a-real-key"}):
                exercise(
                    operation,
                    GenerationMode.POSITIVE,
                    ANONYMOUS_EXAMPLES,
                    base_url,
                    anonymous,
                    run,
                    expect_status=401,
                )
        run.seconds[label] = time.monotonic() - op_started
    elapsed = time.monotonic() - started
    total = sum(run.cases.values())
    print(f"\nfuzz: {total} cases over {len(run.cases)} operations in {elapsed:.1f} s")
    for label, count in sorted(run.cases.items()):
        statuses = {code: n for (name, code), n in sorted(run.statuses.items()) if name == label}
        print(f"fuzz:   {count:5d}  {run.seconds[label]:5.1f} s  {label}  {statuses}")
    assert not run.failures, "\n".join(run.failures[:20])
    assert total >= MIN_CASES
    assert set(run.cases) == labels, f"operations without cases: {labels - set(run.cases)}"
    counts = audit_counts(live_server, run.audited_ids)
    wrong = {rid: counts[rid] for rid in run.audited_ids if counts[rid] != 1}
    assert not wrong, f"requests without exactly one audit record: {list(wrong.items())[:10]}"
