"""What the OpenAPI document says beyond what Litestar infers from the handlers: the
bearer key, and the error responses in OpenAI's shape."""

from __future__ import annotations

from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Components, SecurityScheme
from pydantic import BaseModel

BEARER = "bearer"
BEARER_SECURITY: list[dict[str, list[str]]] = [{BEARER: []}]
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
    502: "The model's upstream server failed or answered malformed.",
    503: "Bastion is still loading, cannot write its audit log, or no upstream server of "
    "the model is reachable.",
    504: "The model's upstream server did not answer in time.",
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
