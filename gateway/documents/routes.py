"""The document API: search without generation (`user`, `admin`), and upload, list, get
and delete documents (`admin`); always within the caller's tenant."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from litestar import Request, Router, delete, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import UploadFile
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath, FromQuery, JSONBody, MultipartBody
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.audit.admin_request import audit_admin_request
from gateway.http.auth import ADMIN_ROLES, CHAT_ROLES, IdentityDep, ServicesDep, require_roles
from gateway.http.body import require_json
from gateway.http.errors import ApiError, not_found
from gateway.http.openapi_docs import BEARER_SECURITY, errors
from gateway.policy.runtime import policy_for
from retrieval import DocumentInfo, UnsupportedDocumentError

MAX_UPLOAD_BYTES = 20 * 1024 * 1024


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000)
    collections: list[str] | None = None
    top_k: int = Field(default=5, ge=1, le=50)
    min_score: float | None = Field(default=None, ge=-1.0, le=1.0)
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    rerank: bool = True


class SearchHit(BaseModel):
    """A `RetrievedChunk` as the API shows it."""

    model_config = ConfigDict(from_attributes=True)

    document_id: str
    chunk_id: int
    title: str
    source: str
    collection: str
    section: str | None
    page: int | None
    char_start: int | None
    char_end: int | None
    score: float
    text: str

    @field_validator("score")
    @classmethod
    def _rounded(cls, score: float) -> float:
        return round(score, 4)


class SearchResults(BaseModel):
    object: Literal["list"] = "list"
    data: list[SearchHit]


@dataclass
class UploadForm:
    file: UploadFile
    collection: str = "docs"


class UploadResult(BaseModel):
    id: str
    chunks: int
    status: str


class DocumentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DocumentInfo]


class DeletedDocument(BaseModel):
    id: str
    deleted: bool = True


async def _require_multipart(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    if not connection.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(
            415,
            "Upload a document as multipart/form-data with a 'file' field.",
            code="unsupported_media_type",
        )


@post(
    "/search",
    status_code=200,
    guards=[require_roles(CHAT_ROLES), require_json],
    responses=errors(400, 413, 415),
)
async def search_documents(
    data: JSONBody[SearchRequest], services: ServicesDep, identity: IdentityDep
) -> SearchResults:
    settings = policy_for(services.policies, identity).loaded.policy.retrieval
    collections = data.collections or settings.collections
    min_score = settings.min_score if data.min_score is None else data.min_score
    try:
        chunks = await asyncio.to_thread(
            services.store.search,
            identity.tenant,
            collections,
            data.query,
            data.top_k,
            min_score,
            mode=data.mode,
            rerank=data.rerank,
        )
    except ValueError as exc:
        raise ApiError(400, str(exc), param="collections", code="invalid_value") from exc
    return SearchResults(data=[SearchHit.model_validate(c) for c in chunks])


@post(
    "/",
    status_code=201,
    guards=[require_roles(ADMIN_ROLES), _require_multipart],
    responses=errors(400, 413, 415),
)
async def upload_document(
    request: Request[Any, Any, Any],
    data: MultipartBody[UploadForm],
    services: ServicesDep,
    identity: IdentityDep,
) -> UploadResult:
    content = await data.file.read()
    if len(content) > MAX_UPLOAD_BYTES:
        raise ApiError(
            413,
            f"Documents may be at most {MAX_UPLOAD_BYTES} bytes.",
            param="file",
            code="file_too_large",
        )
    collection = data.collection or "docs"
    try:
        result = await asyncio.to_thread(
            services.store.ingest_bytes, identity.tenant, collection, data.file.filename, content
        )
    except (UnsupportedDocumentError, ValueError) as exc:
        raise ApiError(400, str(exc), param="file", code="unsupported_document") from exc
    await audit_admin_request(
        request,
        services,
        identity,
        "admin.document_ingested",
        document=result.document_id,
        collection=collection,
        status=result.status,
    )
    return UploadResult(id=result.document_id, chunks=result.chunks, status=result.status)


@get("/", guards=[require_roles(ADMIN_ROLES)], responses=errors(400))
async def list_documents(
    services: ServicesDep, identity: IdentityDep, collection: FromQuery[str | None] = None
) -> DocumentList:
    try:
        documents = await asyncio.to_thread(
            services.store.list_documents, identity.tenant, collection
        )
    except ValueError as exc:
        raise ApiError(400, str(exc), param="collection", code="invalid_value") from exc
    return DocumentList(data=documents)


@get("/{document_id:str}", guards=[require_roles(ADMIN_ROLES)], responses=errors(400, 404))
async def get_document(
    document_id: FromPath[str], services: ServicesDep, identity: IdentityDep
) -> DocumentInfo:
    found = await asyncio.to_thread(services.store.get_document, identity.tenant, document_id)
    if found is None:
        raise not_found(f"No document '{document_id}' in your tenant.", "document_id")
    return found


@delete(
    "/{document_id:str}",
    status_code=200,
    guards=[require_roles(ADMIN_ROLES)],
    responses=errors(400, 404),
)
async def delete_document(
    request: Request[Any, Any, Any],
    document_id: FromPath[str],
    services: ServicesDep,
    identity: IdentityDep,
) -> DeletedDocument:
    deleted = await asyncio.to_thread(services.store.delete_document, identity.tenant, document_id)
    if not deleted:
        raise not_found(f"No document '{document_id}' in your tenant.", "document_id")
    await audit_admin_request(
        request, services, identity, "admin.document_deleted", document=document_id
    )
    return DeletedDocument(id=document_id)


DOCUMENT_ROUTER = Router(
    path="/documents",
    route_handlers=[
        search_documents,
        upload_document,
        list_documents,
        get_document,
        delete_document,
    ],
    security=BEARER_SECURITY,
    tags=["documents"],
)
