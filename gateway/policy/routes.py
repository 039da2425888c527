"""The policy admin API (role `admin`): the tenant's policies and a forced reload."""

from __future__ import annotations

import asyncio
from typing import Literal

from litestar import Router, get, post
from pydantic import BaseModel, ConfigDict, Field

from gateway.audit.entries import key_actor
from gateway.http.auth import ADMIN_ROLES, IdentityDep, ServicesDep, require_roles
from gateway.http.openapi_docs import BEARER_SECURITY, errors
from gateway.policy.registry import PolicyStatus


class PolicyStatusList(BaseModel):
    object: Literal["list"] = "list"
    data: list[PolicyStatus]
    reload_failures: int


class ChangeView(BaseModel):
    """A `PolicyChange` as the reload route reports it."""

    model_config = ConfigDict(from_attributes=True)

    policy: str | None = Field(validation_alias="name")
    old_version: str | None
    new_version: str | None
    error: str | None


class ReloadResult(BaseModel):
    changes: list[ChangeView]


@get("/", responses=errors())
async def policy_status(services: ServicesDep, identity: IdentityDep) -> PolicyStatusList:
    """The policies bound to the admin's tenant, with their versions and last errors."""
    bound = {
        str(p.path)
        for p in services.policies.loaded()
        if identity.tenant in p.policy.applies_to.tenants
    }
    statuses = [s for s in services.policies.status() if s.path in bound]
    return PolicyStatusList(data=statuses, reload_failures=services.policies.reload_failures)


@post("/reload", status_code=200, responses=errors())
async def reload_policies(services: ServicesDep, identity: IdentityDep) -> ReloadResult:
    changes = await asyncio.to_thread(services.policies.reload, key_actor(identity.key_id), True)
    return ReloadResult(changes=[ChangeView.model_validate(c) for c in changes])


POLICY_ROUTER = Router(
    path="/admin/policies",
    route_handlers=[policy_status, reload_policies],
    guards=[require_roles(ADMIN_ROLES)],
    security=BEARER_SECURITY,
    tags=["policies"],
)
