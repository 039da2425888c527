"""API keys: created once, shown once, stored as a hash, looked up per request."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.models import ApiKey, utc_now

Role = Literal["user", "admin", "auditor"]
ROLES: tuple[str, ...] = get_args(Role)
KEY_PREFIX = "bst_"


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """Who is calling: the key's id (never its secret), tenant and role."""

    key_id: str
    tenant: str
    role: str


def hash_key(secret: str) -> str:
    # Keys carry 256 random bits, so a fast hash is enough: no dictionary attack applies.
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(sessions: sessionmaker[Session], tenant: str, role: str) -> tuple[str, KeyIdentity]:
    """Create a key and return its secret (the only time it exists) and identity."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if not tenant or len(tenant) > 128:
        raise ValueError("tenant must be 1 to 128 characters")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(
        id=uuid.uuid4().hex,
        key_hash=hash_key(secret),
        prefix=secret[:10],
        tenant=tenant,
        role=role,
    )
    with sessions.begin() as session:
        session.add(row)
    return secret, KeyIdentity(row.id, tenant, role)


def authenticate(sessions: sessionmaker[Session], secret: str) -> KeyIdentity | None:
    """The identity of a presented key, or None when it is unknown or revoked."""
    with sessions() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret)))
        if row is None or row.revoked_at is not None:
            return None
        return KeyIdentity(row.id, row.tenant, row.role)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What may be shown about a key: never its secret or hash."""

    key_id: str
    prefix: str
    tenant: str
    role: str
    created_at: datetime
    revoked: bool


def list_keys(sessions: sessionmaker[Session], tenant: str | None = None) -> list[KeyInfo]:
    query = select(ApiKey).order_by(ApiKey.created_at)
    if tenant is not None:
        query = query.where(ApiKey.tenant == tenant)
    with sessions() as session:
        return [
            KeyInfo(k.id, k.prefix, k.tenant, k.role, k.created_at, k.revoked_at is not None)
            for k in session.scalars(query)
        ]


def revoke_key(sessions: sessionmaker[Session], key_id: str) -> KeyIdentity | None:
    """Revoke a key at once; None when no such key exists."""
    with sessions.begin() as session:
        row = session.get(ApiKey, key_id)
        if row is None:
            return None
        if row.revoked_at is None:
            row.revoked_at = utc_now()
        return KeyIdentity(row.id, row.tenant, row.role)
