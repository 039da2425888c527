"""What the OpenAPI document says beyond what Litestar infers from the handlers.

Handlers read their bodies and query strings themselves (so that authentication runs
first and every error keeps OpenAI's shape), which hides them from Litestar; these helpers
declare them, with the bearer key and the error responses, for clients and for the fuzzer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import (
    Components,
    OpenAPIMediaType,
    Operation,
    Parameter,
    RequestBody,
    Schema,
    SecurityScheme,
)
from pydantic import BaseModel

BEARER = "bearer"
COMPONENTS = Components(security_schemes={BEARER: SecurityScheme(type="http", scheme="bearer")})
_DESCRIPTIONS = {
    400: "The request is invalid: its body, a parameter or a guardrail's verdict.",
    401: "No API key, or one that is unknown, revoked or expired.",
    403: "The key's role or tenant may not do this.",
    404: "No such object in the caller's tenant.",
    413: "The request body is over the size limit.",
    415: "The body is not of the media type this route reads.",
    429: "A rate limit or quota was reached.",
    431: "The request's headers are over the size limit.",
    500: "The server failed; the request is audited.",
    503: "Bastion is still loading, or cannot write its audit log.",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


def errors(*statuses: int) -> dict[int, ResponseSpec]:
    """Error responses for `statuses` and for 401, 403, 431, 500 and 503, which any route
    that needs a key can return."""
    return {
        status: ResponseSpec(
            data_container=ErrorBody, description=_DESCRIPTIONS[status], generate_examples=False
        )
        for status in sorted({401, 403, 431, 500, 503, *statuses})
    }


def documented(
    body: type[BaseModel] | None = None,
    *,
    form: dict[str, Any] | None = None,
    query: dict[str, dict[str, Any]] | None = None,
) -> type[Operation]:
    """An Operation that needs the bearer key and declares the JSON `body` (a pydantic
    model), a multipart `form` (a JSON Schema) and `query` parameters (name: JSON Schema)."""
    content: dict[str, OpenAPIMediaType] = {}
    if body is not None:
        content["application/json"] = OpenAPIMediaType(schema=_schema(_inlined(body)))
    if form is not None:
        content["multipart/form-data"] = OpenAPIMediaType(schema=_schema(form))
    parameters = [
        Parameter(name=name, param_in="query", required=False, schema=_schema(schema))
        for name, schema in (query or {}).items()
    ]

    @dataclass
    class DocumentedOperation(Operation):
        def __post_init__(self) -> None:
            self.security = [{BEARER: []}]
            if content:
                self.request_body = RequestBody(content=content, required=True)
            if parameters:
                self.parameters = [*(self.parameters or []), *parameters]

    return DocumentedOperation


def _schema(json_schema: dict[str, Any]) -> Schema:
    # The document is serialised by walking dicts, so a JSON Schema dict can stand in for
    # Litestar's Schema object as it is.
    return json_schema  # type: ignore[return-value]


def _inlined(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema with its `$defs` inlined (these models are not recursive)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(definitions[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    result: dict[str, Any] = inline(schema)
    return result
