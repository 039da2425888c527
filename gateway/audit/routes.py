"""The auditor API: filter, read, export and verify the audit log (role `auditor`)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any, Literal, TypeAlias

from litestar import Router, get
from litestar.di import Dependency, Provide
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Stream
from pydantic import BaseModel, ConfigDict, Field

from gateway.audit.chain import verify_chain
from gateway.audit.query import AuditFilter, export_lines, page, read_record
from gateway.http.auth import AUDIT_ROLES, IdentityDep, ServicesDep, require_roles
from gateway.http.errors import ApiError, not_found
from gateway.http.openapi_docs import BEARER_SECURITY, errors

MAX_PAGE = 500
MAX_CURSOR = 2**62


class AuditRecordView(BaseModel):
    """One record as reviewers read it: every column of `audit_records`, its text
    decrypted (or `[erased]`), its time in the canonical form the chain hashes."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: int
    seq: int
    prev_hash: str
    record_hash: str
    event: str
    request_id: str
    created_at: str = Field(json_schema_extra={"format": "date-time"})
    endpoint: str
    tenant: str | None
    key_id: str | None
    end_user: str | None
    policy_version: str | None
    model: str | None
    outcome: str
    status_code: int
    error_code: str | None
    verdicts: list[dict[str, Any]]
    chunk_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    engine_ms: float
    prompt_sha256: str | None
    answer_sha256: str | None
    prompt_text: str | None
    answer_text: str | None
    details: dict[str, Any]


class AuditPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[AuditRecordView]
    next_cursor: int | None


class ChainVerification(BaseModel):
    """What `verify_chain` reports."""

    model_config = ConfigDict(from_attributes=True)

    ok: bool
    records: int
    first_seq: int
    head_seq: int
    head_hash: str
    problems: list[str]


def _audit_filter(
    identity: IdentityDep,
    since: FromQuery[datetime | None] = None,
    until: FromQuery[datetime | None] = None,
    tenant: FromQuery[str | None] = None,
    key_id: FromQuery[str | None] = None,
    end_user: FromQuery[str | None] = None,
    outcome: FromQuery[str | None] = None,
    event: FromQuery[str | None] = None,
    policy_version: FromQuery[str | None] = None,
    check: FromQuery[str | None] = None,
    verdict: FromQuery[str | None] = None,
) -> AuditFilter:
    """The filter the query string asks for, within the auditor's own tenant."""
    if tenant is not None and tenant != identity.tenant:
        raise ApiError(
            403,
            "Auditors read their own tenant's records only.",
            type="permission_error",
            code="tenant_mismatch",
            param="tenant",
        )
    return AuditFilter(
        since=since,
        until=until,
        tenant=identity.tenant,
        key_id=key_id,
        end_user=end_user,
        outcome=outcome,
        event=event,
        policy_version=policy_version,
        check=check,
        verdict=verdict,
    )


FilterParam: TypeAlias = Annotated[AuditFilter, Dependency(kind="named")]


@get("/records", responses=errors(400))
async def list_audit_records(
    services: ServicesDep,
    audit_filter: FilterParam,
    cursor: Annotated[int, QueryParameter(ge=0, le=MAX_CURSOR)] = 0,
    limit: Annotated[int, QueryParameter(ge=0, le=MAX_PAGE)] = 100,
) -> AuditPage:
    items, next_cursor = await asyncio.to_thread(
        page, services.sessions, audit_filter, cursor, limit or 100
    )
    return AuditPage(
        data=[AuditRecordView.model_validate(item) for item in items], next_cursor=next_cursor
    )


@get("/records/{seq:int}", responses=errors(400, 404))
async def get_audit_record(
    seq: FromPath[int], services: ServicesDep, identity: IdentityDep
) -> AuditRecordView:
    found = await asyncio.to_thread(read_record, services.sessions, seq, identity.tenant)
    if found is None:
        raise not_found(f"No audit record {seq} in your tenant.", "seq")
    return AuditRecordView.model_validate(found)


@get("/export", responses=errors(400))
async def export_audit_records(
    services: ServicesDep,
    audit_filter: FilterParam,
    format: FromQuery[Literal["jsonl", "csv"]] = "jsonl",
) -> Stream:
    lines = export_lines(services.sessions, audit_filter, format)
    media = "text/csv" if format == "csv" else "application/x-ndjson"
    return Stream(
        (line.encode() for line in lines),
        media_type=media,
        headers={"content-disposition": f'attachment; filename="audit.{format}"'},
    )


@get("/verify", responses=errors())
async def verify_audit_chain(services: ServicesDep) -> ChainVerification:
    report = await asyncio.to_thread(verify_chain, services.sessions)
    return ChainVerification.model_validate(report)


AUDIT_ROUTER = Router(
    path="/audit",
    route_handlers=[list_audit_records, get_audit_record, export_audit_records, verify_audit_chain],
    guards=[require_roles(AUDIT_ROLES)],
    dependencies={"audit_filter": Provide(_audit_filter, sync_to_thread=False)},
    security=BEARER_SECURITY,
    tags=["audit"],
)
