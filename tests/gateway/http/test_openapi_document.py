"""The OpenAPI document comes from the handlers' typed parameters: every route, its body
schema, its query parameters and the bearer key, with no hand-made patching."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.app import create_app
from gateway.settings import Settings

PUBLIC = {"/healthz", "/readyz", "/metrics"}
# Each body-taking route, its media type, and fields its schema must declare.
BODIES = {
    ("post", "/v1/chat/completions"): ("application/json", {"messages", "tools", "stream"}),
    ("post", "/v1/completions"): ("application/json", {"prompt", "logprobs", "stream"}),
    ("post", "/v1/embeddings"): ("application/json", {"input", "encoding_format", "dimensions"}),
    ("post", "/v1/guardrails/check"): (
        "application/json",
        {"text", "messages", "direction", "checks"},
    ),
    ("post", "/admin/keys"): ("application/json", {"role", "expires_at"}),
    ("post", "/admin/keys/{key_id}/rotate"): ("application/json", {"grace_seconds"}),
    ("post", "/documents/search"): ("application/json", {"query", "top_k", "mode"}),
    ("post", "/documents"): ("multipart/form-data", {"file", "collection"}),
}
QUERIES = {
    ("get", "/audit/records"): {"since", "until", "tenant", "outcome", "cursor", "limit"},
    ("get", "/audit/export"): {"since", "event", "verdict", "format"},
    ("get", "/documents"): {"collection"},
}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    schema: dict[str, Any] = create_app(Settings()).openapi_schema.to_schema()
    return schema


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    found: dict[str, Any] = document["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    return found


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


def test_every_route_of_the_app_is_documented(document: dict[str, Any]) -> None:
    documented = {(method, path) for method, path, _ in operations(document)}
    assert set(BODIES) | set(QUERIES) <= documented
    expected = {
        ("get", "/v1/models"),
        ("get", "/audit/records/{seq}"),
        ("get", "/audit/verify"),
        ("get", "/admin/keys"),
        ("delete", "/admin/keys/{key_id}"),
        ("get", "/admin/policies"),
        ("post", "/admin/policies/reload"),
        ("get", "/documents/{document_id}"),
        ("delete", "/documents/{document_id}"),
        *(("get", path) for path in PUBLIC),
    }
    assert expected <= documented
    assert len(documented) == len(expected | set(BODIES) | set(QUERIES))


@pytest.mark.parametrize(("route", "body"), BODIES.items(), ids=[p for _, p in BODIES])
def test_each_body_is_documented_with_its_schema(
    document: dict[str, Any], route: tuple[str, str], body: tuple[str, set[str]]
) -> None:
    method, path = route
    media_type, fields = body
    request_body = document["paths"][path][method]["requestBody"]
    schema = resolve(document, request_body["content"][media_type]["schema"])
    assert fields <= set(schema["properties"]), schema


@pytest.mark.parametrize(("route", "names"), QUERIES.items(), ids=[p for _, p in QUERIES])
def test_query_parameters_are_documented(
    document: dict[str, Any], route: tuple[str, str], names: set[str]
) -> None:
    method, path = route
    parameters = document["paths"][path][method]["parameters"]
    assert names <= {p["name"] for p in parameters if p["in"] == "query"}


def test_every_keyed_route_declares_the_bearer_key_and_openai_errors(
    document: dict[str, Any],
) -> None:
    for method, path, operation in operations(document):
        if path in PUBLIC:
            continue
        assert operation.get("security") == [{"bearer": []}], (method, path)
        error = resolve(
            document, operation["responses"]["401"]["content"]["application/json"]["schema"]
        )
        assert "error" in error["properties"], (method, path)
