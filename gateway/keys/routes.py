"""The key admin API (role `admin`, own tenant only): create, list, rotate and revoke."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import structlog
from litestar import Request, Router, delete, get, post
from litestar.params import FromPath, JSONBody
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.audit.admin_request import audit_admin_request
from gateway.http.auth import ADMIN_ROLES, IdentityDep, ServicesDep, require_roles
from gateway.http.body import require_json
from gateway.http.errors import not_found
from gateway.http.openapi_docs import BEARER_SECURITY, errors
from gateway.keys.store import KeyIdentity, create_key, list_keys, revoke_key, rotate_key
from gateway.keys.tenant_binding import unbound_tenant_warning
from gateway.services import Services

log = structlog.get_logger(__name__)

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


class NewKey(BaseModel):
    """A key's secret, shown this once."""

    id: str
    key: str
    tenant: str
    role: str
    replaces: str | None = None
    warnings: list[str] = Field(
        default_factory=list,
        description="What to fix before the key works, e.g. no policy binds its tenant.",
    )


class KeyView(BaseModel):
    """A `KeyInfo` as the API lists it (never the secret)."""

    model_config = ConfigDict(from_attributes=True)

    id: str = Field(validation_alias="key_id")
    prefix: str
    tenant: str
    role: str
    created_at: datetime
    expires_at: datetime | None
    revoked: bool
    requests_per_minute: int | None
    tokens_per_minute: int | None


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyView]


class RevokedKey(BaseModel):
    id: str
    revoked: bool = True


@post("/", status_code=201, guards=[require_json], responses=errors(400, 413, 415))
async def create_api_key(
    request: Request[Any, Any, Any],
    data: JSONBody[CreateKeyRequest],
    services: ServicesDep,
    identity: IdentityDep,
) -> NewKey:
    secret, created = await asyncio.to_thread(
        create_key,
        services.sessions,
        identity.tenant,
        data.role,
        expires_at=data.expires_at,
        requests_per_minute=data.requests_per_minute,
        tokens_per_minute=data.tokens_per_minute,
    )
    await audit_admin_request(
        request, services, identity, "admin.key_created", key=created.key_id, role=created.role
    )
    return NewKey(
        id=created.key_id,
        key=secret,
        tenant=created.tenant,
        role=created.role,
        warnings=_binding_warnings(services, created),
    )


def _binding_warnings(services: Services, created: KeyIdentity) -> list[str]:
    """A warning when no policy binds the new key's tenant; logged without the secret."""
    if services.policies.for_tenant(created.tenant) is not None:
        return []
    folder = services.policies.folder
    log.warning(
        "keys.tenant_unbound",
        tenant=created.tenant,
        key_id=created.key_id,
        policy_dir=str(folder),
    )
    return [unbound_tenant_warning(created.tenant, folder)]


@get("/", responses=errors())
async def list_api_keys(services: ServicesDep, identity: IdentityDep) -> KeyList:
    keys = await asyncio.to_thread(list_keys, services.sessions, identity.tenant)
    return KeyList(data=[KeyView.model_validate(k) for k in keys])


@post(
    "/{key_id:str}/rotate",
    status_code=200,
    guards=[require_json],
    responses=errors(400, 404, 413, 415),
)
async def rotate_api_key(
    request: Request[Any, Any, Any],
    key_id: FromPath[str],
    data: JSONBody[RotateKeyRequest],
    services: ServicesDep,
    identity: IdentityDep,
) -> NewKey:
    rotated = await asyncio.to_thread(
        rotate_key,
        services.sessions,
        key_id,
        identity.tenant,
        timedelta(seconds=data.grace_seconds),
    )
    if rotated is None:
        raise not_found(f"No active key '{key_id}' in your tenant.", "key_id")
    secret, new = rotated
    await audit_admin_request(
        request, services, identity, "admin.key_rotated", old_key=key_id, key=new.key_id
    )
    return NewKey(id=new.key_id, key=secret, tenant=new.tenant, role=new.role, replaces=key_id)


@delete("/{key_id:str}", status_code=200, responses=errors(400, 404))
async def revoke_api_key(
    request: Request[Any, Any, Any],
    key_id: FromPath[str],
    services: ServicesDep,
    identity: IdentityDep,
) -> RevokedKey:
    revoked = await asyncio.to_thread(revoke_key, services.sessions, key_id, identity.tenant)
    if revoked is None:
        raise not_found(f"No active key '{key_id}' in your tenant.", "key_id")
    await audit_admin_request(request, services, identity, "admin.key_revoked", key=key_id)
    return RevokedKey(id=key_id)


KEY_ROUTER = Router(
    path="/admin/keys",
    route_handlers=[create_api_key, list_api_keys, rotate_api_key, revoke_api_key],
    guards=[require_roles(ADMIN_ROLES)],
    security=BEARER_SECURITY,
    tags=["keys"],
)
