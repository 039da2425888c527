"""The admin API (role `admin`, own tenant only): API keys and policy status."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from litestar import Request, Response, delete, get, post
from litestar.params import FromPath
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.audit.log import AuditEntry
from gateway.http.auth import ADMIN_ROLES, identify, services_of
from gateway.http.body import read_json
from gateway.http.errors import ApiError
from gateway.keys.store import KeyIdentity, KeyInfo, create_key, list_keys, revoke_key, rotate_key
from gateway.http.openapi_docs import documented, errors
from gateway.services import Services

MAX_LIMIT = 2**31 - 1  # the largest value an INTEGER column holds in PostgreSQL too


class CreateKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "admin", "auditor"]
    expires_at: datetime | None = None
    requests_per_minute: int | None = Field(default=None, ge=1, le=MAX_LIMIT)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=MAX_LIMIT)

    @field_validator("expires_at")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        """Stored in UTC: SQLite keeps no offset, and a naive time is read as UTC."""
        if value is None:
            return None
        try:
            return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        except OverflowError as exc:
            raise ValueError("the time is out of range") from exc


class RotateKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: int = Field(default=0, ge=0, le=7 * 24 * 3600)


def _key_json(info: KeyInfo) -> dict[str, Any]:
    return {
        "id": info.key_id,
        "prefix": info.prefix,
        "tenant": info.tenant,
        "role": info.role,
        "created_at": info.created_at.isoformat(),
        "expires_at": info.expires_at.isoformat() if info.expires_at else None,
        "revoked": info.revoked,
        "requests_per_minute": info.requests_per_minute,
        "tokens_per_minute": info.tokens_per_minute,
    }


async def audit_admin_request(
    services: Services,
    request: Request[Any, Any, Any],
    admin: KeyIdentity,
    event: str,
    **details: Any,
) -> None:
    """An admin action over HTTP: one audit record naming the admin's key."""
    entry = AuditEntry(
        request_id=f"admin_{uuid.uuid4().hex}",
        endpoint=request.url.path,
        event=event,
        tenant=admin.tenant,
        key_id=admin.key_id,
        outcome="ok",
        status_code=200,
        details={"actor": f"key:{admin.key_id}", **details},
    )
    await asyncio.to_thread(services.audit.record, entry)


def _not_found(key_id: str) -> ApiError:
    return ApiError(
        404,
        f"No active key '{key_id}' in your tenant.",
        type="not_found_error",
        code="not_found",
        param="key_id",
    )


@post(
    "/admin/keys",
    status_code=201,
    operation_class=documented(CreateKeyRequest),
    responses=errors(400, 413, 415),
)
async def create_api_key(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    body = await read_json(request, CreateKeyRequest)
    secret, identity = await asyncio.to_thread(
        create_key,
        services.sessions,
        admin.tenant,
        body.role,
        expires_at=body.expires_at,
        requests_per_minute=body.requests_per_minute,
        tokens_per_minute=body.tokens_per_minute,
    )
    await audit_admin_request(
        services, request, admin, "admin.key_created", key=identity.key_id, role=identity.role
    )
    return {"id": identity.key_id, "key": secret, "tenant": identity.tenant, "role": identity.role}


@get("/admin/keys", operation_class=documented(), responses=errors())
async def list_api_keys(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    keys = await asyncio.to_thread(list_keys, services.sessions, admin.tenant)
    return {"object": "list", "data": [_key_json(k) for k in keys]}


@post(
    "/admin/keys/{key_id:str}/rotate",
    status_code=200,
    operation_class=documented(RotateKeyRequest),
    responses=errors(400, 404, 413, 415),
)
async def rotate_api_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> dict[str, Any]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    body = await read_json(request, RotateKeyRequest)
    rotated = await asyncio.to_thread(
        rotate_key, services.sessions, key_id, admin.tenant, timedelta(seconds=body.grace_seconds)
    )
    if rotated is None:
        raise _not_found(key_id)
    secret, identity = rotated
    await audit_admin_request(
        services, request, admin, "admin.key_rotated", old_key=key_id, key=identity.key_id
    )
    return {
        "id": identity.key_id,
        "key": secret,
        "tenant": identity.tenant,
        "role": identity.role,
        "replaces": key_id,
    }


@delete(
    "/admin/keys/{key_id:str}",
    status_code=200,
    operation_class=documented(),
    responses=errors(400, 404),
)
async def revoke_api_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> dict[str, Any]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    revoked = await asyncio.to_thread(revoke_key, services.sessions, key_id, admin.tenant)
    if revoked is None:
        raise _not_found(key_id)
    await audit_admin_request(services, request, admin, "admin.key_revoked", key=key_id)
    return {"id": key_id, "revoked": True}


@get("/admin/policies", operation_class=documented(), responses=errors())
async def policy_status(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The policies bound to the admin's tenant, with their versions and last errors."""
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    bound = {
        p.path for p in services.policies.loaded() if admin.tenant in p.policy.applies_to.tenants
    }
    statuses = [s for s in services.policies.status() if s.path in {str(b) for b in bound}]
    return {
        "object": "list",
        "data": [asdict(s) for s in statuses],
        "reload_failures": services.policies.reload_failures,
    }


@post("/admin/policies/reload", status_code=200, operation_class=documented(), responses=errors())
async def reload_policies(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    services = services_of(request)
    admin = await identify(request, services, ADMIN_ROLES)
    changes = await asyncio.to_thread(services.policies.reload, f"key:{admin.key_id}", True)
    return Response(
        {
            "changes": [
                {
                    "policy": c.name,
                    "old_version": c.old_version,
                    "new_version": c.new_version,
                    "error": c.error,
                }
                for c in changes
            ]
        }
    )


ADMIN_ROUTES = [
    create_api_key,
    list_api_keys,
    rotate_api_key,
    revoke_api_key,
    policy_status,
    reload_policies,
]
