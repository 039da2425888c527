"""The auditor API: filter, read, export and verify the audit log (role `auditor`)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any, Literal

from litestar import Request, get
from litestar.params import FromPath
from litestar.response import Stream

from gateway.audit.chain import verify_chain
from gateway.audit.query import AuditFilter, export_lines, page, read_record
from gateway.http.auth import AUDIT_ROLES, identify, services_of
from gateway.http.errors import ApiError
from gateway.keys.store import KeyIdentity
from gateway.http.openapi_docs import documented, errors

MAX_PAGE = 500
_TEXT_FILTERS = ("tenant", "key_id", "end_user", "outcome", "event", "policy_version", "check")
FILTER_QUERY: dict[str, dict[str, Any]] = {
    "since": {"type": "string", "format": "date-time"},
    "until": {"type": "string", "format": "date-time"},
    **{name: {"type": "string"} for name in (*_TEXT_FILTERS, "verdict")},
}
PAGE_QUERY = FILTER_QUERY | {
    "cursor": {"type": "integer", "minimum": 0, "maximum": 2**62},
    "limit": {"type": "integer", "minimum": 0, "maximum": MAX_PAGE},
}
EXPORT_QUERY = FILTER_QUERY | {"format": {"type": "string", "enum": ["jsonl", "csv"]}}


def _datetime_param(request: Request[Any, Any, Any], name: str) -> datetime | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError as exc:
        raise ApiError(
            400,
            f"'{name}' must be an ISO 8601 time, not {value!r}.",
            param=name,
            code="invalid_value",
        ) from exc


def _int_param(request: Request[Any, Any, Any], name: str, default: int, high: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    if not value.isdigit() or not 0 <= int(value) <= high:
        raise ApiError(
            400, f"'{name}' must be an integer from 0 to {high}.", param=name, code="invalid_value"
        )
    return int(value)


def _filter(request: Request[Any, Any, Any], identity: KeyIdentity) -> AuditFilter:
    params = request.query_params
    requested = params.get("tenant")
    if requested is not None and requested != identity.tenant:
        raise ApiError(
            403,
            "Auditors read their own tenant's records only.",
            type="permission_error",
            code="tenant_mismatch",
            param="tenant",
        )
    return AuditFilter(
        since=_datetime_param(request, "since"),
        until=_datetime_param(request, "until"),
        tenant=identity.tenant,
        key_id=params.get("key_id"),
        end_user=params.get("end_user"),
        outcome=params.get("outcome"),
        event=params.get("event"),
        policy_version=params.get("policy_version"),
        check=params.get("check"),
        verdict=params.get("verdict"),
    )


@get("/audit/records", operation_class=documented(query=PAGE_QUERY), responses=errors(400))
async def list_audit_records(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = services_of(request)
    identity = await identify(request, services, AUDIT_ROLES)
    audit_filter = _filter(request, identity)
    cursor = _int_param(request, "cursor", 0, 2**62)
    limit = _int_param(request, "limit", 100, MAX_PAGE) or 100
    items, next_cursor = await asyncio.to_thread(
        page, services.sessions, audit_filter, cursor, limit
    )
    return {"object": "list", "data": items, "next_cursor": next_cursor}


@get("/audit/records/{seq:int}", operation_class=documented(), responses=errors(400, 404))
async def get_audit_record(request: Request[Any, Any, Any], seq: FromPath[int]) -> dict[str, Any]:
    services = services_of(request)
    identity = await identify(request, services, AUDIT_ROLES)

    found = await asyncio.to_thread(read_record, services.sessions, seq, identity.tenant)
    if found is None:
        raise ApiError(
            404,
            f"No audit record {seq} in your tenant.",
            type="not_found_error",
            code="not_found",
            param="seq",
        )
    return found


@get("/audit/export", operation_class=documented(query=EXPORT_QUERY), responses=errors(400))
async def export_audit_records(request: Request[Any, Any, Any]) -> Stream:
    services = services_of(request)
    identity = await identify(request, services, AUDIT_ROLES)
    fmt = request.query_params.get("format", "jsonl")
    if fmt not in ("jsonl", "csv"):
        raise ApiError(
            400, "'format' must be 'jsonl' or 'csv'.", param="format", code="invalid_value"
        )
    chosen: Literal["jsonl", "csv"] = "csv" if fmt == "csv" else "jsonl"
    lines = export_lines(services.sessions, _filter(request, identity), chosen)
    media = "text/csv" if chosen == "csv" else "application/x-ndjson"
    return Stream(
        (line.encode() for line in lines),
        media_type=media,
        headers={"content-disposition": f'attachment; filename="audit.{chosen}"'},
    )


@get("/audit/verify", operation_class=documented(), responses=errors())
async def verify_audit_chain(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = services_of(request)
    await identify(request, services, AUDIT_ROLES)
    report = await asyncio.to_thread(verify_chain, services.sessions)
    return {
        "ok": report.ok,
        "records": report.records,
        "first_seq": report.first_seq,
        "head_seq": report.head_seq,
        "head_hash": report.head_hash,
        "problems": report.problems,
    }


AUDIT_ROUTES = [list_audit_records, get_audit_record, export_audit_records, verify_audit_chain]
