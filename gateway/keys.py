"""API keys: created once, shown once, stored as a hash, looked up per request."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from typing import Literal, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.models import ApiKey

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
