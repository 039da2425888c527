"""`POST /v1/embeddings`: the caller's texts (or token ids) as vectors, in OpenAI's shape."""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, post
from litestar.params import JSONBody

from gateway.audit.request_audit import audit_every_request, caller_audit
from gateway.embeddings.schemas import EmbeddingList, EmbeddingRequest
from gateway.embeddings.service import EMBEDDING_EVENT, EmbeddingService
from gateway.http.auth import IdentityDep, ServicesDep
from gateway.http.guards import MODEL_CALL_GUARD
from gateway.http.openapi_docs import BEARER_SECURITY, errors
from gateway.policy.runtime import policy_for

EMBEDDINGS_PATH = "/v1/embeddings"


@post(
    "/embeddings",
    status_code=200,
    # Every request is audited once by the middleware, denials included.
    guards=[MODEL_CALL_GUARD],
    middleware=[audit_every_request(EMBEDDINGS_PATH, event=EMBEDDING_EVENT)],
    responses=errors(400, 404, 413, 415, 429),
)
async def create_embeddings(
    request: Request[Any, Any, Any],
    data: JSONBody[EmbeddingRequest],
    services: ServicesDep,
    identity: IdentityDep,
) -> EmbeddingList:
    entry = caller_audit(request.scope, identity).entry
    service = EmbeddingService(services, policy_for(services.policies, identity))
    embedded = await service.embed(data, entry)
    await service.charge(identity, embedded)
    return EmbeddingList.of(
        embedded.vectors, services.embedder.model_id, embedded.prompt_tokens, data.encoding_format
    )


EMBEDDINGS_ROUTER = Router(
    path="/v1",
    route_handlers=[create_embeddings],
    security=BEARER_SECURITY,
    tags=["embeddings"],
)
