"""API keys: created once, shown once, stored as a hash, looked up per request."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, get_args

from sqlalchemy import Engine, bindparam, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.models import ApiKey, utc_now

Role = Literal["user", "admin", "auditor"]
ROLES: tuple[str, ...] = get_args(Role)
KEY_PREFIX = "bst_"


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """Who is calling: the key's id (never its secret), tenant, role and own limits."""

    key_id: str
    tenant: str
    role: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What may be shown about a key: never its secret or hash."""

    key_id: str
    prefix: str
    tenant: str
    role: str
    created_at: datetime
    expires_at: datetime | None
    revoked: bool
    requests_per_minute: int | None
    tokens_per_minute: int | None


def hash_key(secret: str) -> str:
    # Keys carry 256 random bits, so a fast hash is enough: no dictionary attack applies.
    return hashlib.sha256(secret.encode()).hexdigest()


def _aware(moment: datetime) -> datetime:
    """SQLite keeps no offset: its times were stored in UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def create_key(
    sessions: sessionmaker[Session],
    tenant: str,
    role: str,
    *,
    expires_at: datetime | None = None,
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
) -> tuple[str, KeyIdentity]:
    """Create a key and return its secret (the only time it exists) and identity."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if not tenant or len(tenant) > 128:
        raise ValueError("tenant must be 1 to 128 characters")
    for name, limit in (
        ("requests_per_minute", requests_per_minute),
        ("tokens_per_minute", tokens_per_minute),
    ):
        if limit is not None and limit < 1:
            raise ValueError(f"{name} must be at least 1")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(
        id=uuid.uuid4().hex,
        key_hash=hash_key(secret),
        prefix=secret[:10],
        tenant=tenant,
        role=role,
        expires_at=expires_at,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
    )
    with sessions.begin() as session:
        session.add(row)
    return secret, _identity(row)


def authenticate(sessions: sessionmaker[Session], secret: str) -> KeyIdentity | None:
    """The identity of a presented key, or None when it is unknown, revoked or expired."""
    return authenticate_many(sessions, [secret])[secret]


# What authentication reads of the presented keys, as plain rows, from one statement
# built once: a lookup runs on every request, and building the query and loading ORM
# objects each time cost three times what the query itself does.
_LIVE_KEYS = select(
    ApiKey.key_hash,
    ApiKey.revoked_at,
    ApiKey.expires_at,
    ApiKey.id,
    ApiKey.tenant,
    ApiKey.role,
    ApiKey.requests_per_minute,
    ApiKey.tokens_per_minute,
).where(ApiKey.key_hash.in_(bindparam("hashes", expanding=True)))


def authenticate_many(
    sessions: sessionmaker[Session], secrets: Collection[str]
) -> dict[str, KeyIdentity | None]:
    """`authenticate` for several presented keys with one query: each secret's identity,
    or None."""
    by_hash = {hash_key(secret): secret for secret in secrets}
    found: dict[str, KeyIdentity | None] = dict.fromkeys(secrets)
    now = utc_now()
    bind: Engine = sessions.kw["bind"]
    with bind.connect() as connection:
        rows = connection.execute(_LIVE_KEYS, {"hashes": list(by_hash)})
        for row in rows:
            if row.revoked_at is not None:
                continue
            if row.expires_at is not None and _aware(row.expires_at) <= now:
                continue
            found[by_hash[row.key_hash]] = KeyIdentity(
                row.id, row.tenant, row.role, row.requests_per_minute, row.tokens_per_minute
            )
    return found


def list_keys(sessions: sessionmaker[Session], tenant: str | None = None) -> list[KeyInfo]:
    query = select(ApiKey).order_by(ApiKey.created_at)
    if tenant is not None:
        query = query.where(ApiKey.tenant == tenant)
    with sessions() as session:
        return [_info(row) for row in session.scalars(query)]


def revoke_key(
    sessions: sessionmaker[Session], key_id: str, tenant: str | None = None
) -> KeyIdentity | None:
    """Revoke a key at once; None when no such key exists (in that tenant)."""
    with sessions.begin() as session:
        row = session.get(ApiKey, key_id)
        if row is None or (tenant is not None and row.tenant != tenant):
            return None
        if row.revoked_at is None:
            row.revoked_at = utc_now()
        return _identity(row)


def rotate_key(
    sessions: sessionmaker[Session],
    key_id: str,
    tenant: str | None = None,
    grace: timedelta = timedelta(0),
) -> tuple[str, KeyIdentity] | None:
    """A new key with the same tenant, role and limits; the old one stops after `grace`."""
    with sessions.begin() as session:
        old = session.get(ApiKey, key_id)
        if old is None or old.revoked_at is not None:
            return None
        if tenant is not None and old.tenant != tenant:
            return None
        settings = (
            old.tenant,
            old.role,
            old.expires_at,
            old.requests_per_minute,
            old.tokens_per_minute,
        )
        if grace > timedelta(0):
            old.expires_at = utc_now() + grace
        else:
            old.revoked_at = utc_now()
    tenant_name, role, expires_at, rpm, tpm = settings
    return create_key(
        sessions,
        tenant_name,
        role,
        expires_at=expires_at,
        requests_per_minute=rpm,
        tokens_per_minute=tpm,
    )


def _identity(row: ApiKey) -> KeyIdentity:
    return KeyIdentity(row.id, row.tenant, row.role, row.requests_per_minute, row.tokens_per_minute)


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(
        key_id=row.id,
        prefix=row.prefix,
        tenant=row.tenant,
        role=row.role,
        created_at=_aware(row.created_at),
        expires_at=_aware(row.expires_at) if row.expires_at else None,
        revoked=row.revoked_at is not None,
        requests_per_minute=row.requests_per_minute,
        tokens_per_minute=row.tokens_per_minute,
    )
