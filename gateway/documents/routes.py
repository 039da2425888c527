"""The document API: search without generation (`user`, `admin`), and upload, list, get
and delete documents (`admin`); always within the caller's tenant."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

from litestar import Request, delete, get, post
from litestar.datastructures import UploadFile
from litestar.params import FromPath
from pydantic import BaseModel, ConfigDict, Field

from gateway.keys.routes import audit_admin_request
from gateway.http.auth import ADMIN_ROLES, CHAT_ROLES, identify, services_of
from gateway.http.body import read_json
from gateway.http.errors import ApiError
from gateway.http.openapi_docs import documented, errors
from gateway.chat.routes import policy_for
from retrieval import UnsupportedDocumentError

MAX_UPLOAD_BYTES = 20 * 1024 * 1024
UPLOAD_FORM = {
    "type": "object",
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "collection": {"type": "string"},
    },
    "required": ["file"],
}


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000)
    collections: list[str] | None = None
    top_k: int = Field(default=5, ge=1, le=50)
    min_score: float | None = Field(default=None, ge=-1.0, le=1.0)
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    rerank: bool = True


def _json(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _document_json(info: Any) -> dict[str, Any]:
    return {key: _json(value) for key, value in asdict(info).items()}


def _not_found(document_id: str) -> ApiError:
    return ApiError(
        404,
        f"No document '{document_id}' in your tenant.",
        type="not_found_error",
        code="not_found",
        param="document_id",
    )


@post(
    "/documents/search",
    status_code=200,
    operation_class=documented(SearchRequest),
    responses=errors(400, 413, 415),
)
async def search_documents(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = services_of(request)
    identity = await identify(request, services, CHAT_ROLES)
    body = await read_json(request, SearchRequest)
    settings = policy_for(services, identity).loaded.policy.retrieval
    collections = body.collections or settings.collections
    min_score = settings.min_score if body.min_score is None else body.min_score
    try:
        chunks = await asyncio.to_thread(
            services.store.search,
            identity.tenant,
            collections,
            body.query,
            body.top_k,
            min_score,
            mode=body.mode,
            rerank=body.rerank,
        )
    except ValueError as exc:
        raise ApiError(400, str(exc), param="collections", code="invalid_value") from exc
    return {
        "object": "list",
        "data": [
            {
                "document_id": c.document_id,
                "chunk_id": c.chunk_id,
                "title": c.title,
                "source": c.source,
                "collection": c.collection,
                "section": c.section,
                "page": c.page,
                "char_start": c.char_start,
                "char_end": c.char_end,
                "score": round(c.score, 4),
                "text": c.text,
            }
            for c in chunks
        ],
    }


@post(
    "/documents",
    status_code=201,
    operation_class=documented(form=UPLOAD_FORM),
    responses=errors(400, 413, 415),
)
async def upload_document(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(
            415,
            "Upload a document as multipart/form-data with a 'file' field.",
            code="unsupported_media_type",
        )
    form = await request.form()
    upload = form.get("file")
    collection = form.get("collection") or "docs"
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "The form needs a 'file' field.", param="file", code="missing")
    data = await upload.read()
    if len(data) > MAX_UPLOAD_BYTES:
        raise ApiError(
            413,
            f"Documents may be at most {MAX_UPLOAD_BYTES} bytes.",
            param="file",
            code="file_too_large",
        )
    try:
        result = await asyncio.to_thread(
            services.store.ingest_bytes, admin.tenant, str(collection), upload.filename, data
        )
    except (UnsupportedDocumentError, ValueError) as exc:
        raise ApiError(400, str(exc), param="file", code="unsupported_document") from exc
    await audit_admin_request(
        services,
        request,
        admin,
        "admin.document_ingested",
        document=result.document_id,
        collection=str(collection),
        status=result.status,
    )
    return {"id": result.document_id, "chunks": result.chunks, "status": result.status}


@get(
    "/documents",
    operation_class=documented(query={"collection": {"type": "string"}}),
    responses=errors(400),
)
async def list_documents(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    collection = request.query_params.get("collection")
    try:
        documents = await asyncio.to_thread(services.store.list_documents, admin.tenant, collection)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="collection", code="invalid_value") from exc
    return {"object": "list", "data": [_document_json(d) for d in documents]}


@get("/documents/{document_id:str}", operation_class=documented(), responses=errors(400, 404))
async def get_document(
    request: Request[Any, Any, Any], document_id: FromPath[str]
) -> dict[str, Any]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    found = await asyncio.to_thread(services.store.get_document, admin.tenant, document_id)
    if found is None:
        raise _not_found(document_id)
    return _document_json(found)


@delete(
    "/documents/{document_id:str}",
    status_code=200,
    operation_class=documented(),
    responses=errors(400, 404),
)
async def delete_document(
    request: Request[Any, Any, Any], document_id: FromPath[str]
) -> dict[str, Any]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    deleted = await asyncio.to_thread(services.store.delete_document, admin.tenant, document_id)
    if not deleted:
        raise _not_found(document_id)
    await audit_admin_request(
        services, request, admin, "admin.document_deleted", document=document_id
    )
    return {"id": document_id, "deleted": True}


DOCUMENT_ROUTES = [search_documents, upload_document, list_documents, get_document, delete_document]
