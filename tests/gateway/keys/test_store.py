"""API keys: shown once, stored as a hash, found again by their secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.models import ApiKey
from gateway.keys.store import authenticate, create_key, hash_key
from gateway.services import open_database
from gateway.settings import Settings


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    return open_database(Settings(data_dir=tmp_path))


def test_created_key_authenticates_and_only_its_hash_is_stored(
    sessions: sessionmaker[Session],
) -> None:
    secret, identity = create_key(sessions, "acme", "admin")
    assert secret.startswith("bst_") and len(secret) > 40
    found = authenticate(sessions, secret)
    assert found == identity
    with sessions() as session:
        row = session.scalars(select(ApiKey)).one()
    assert row.key_hash == hash_key(secret)
    assert secret not in (row.key_hash, row.prefix, row.id)


def test_unknown_key_is_rejected(sessions: sessionmaker[Session]) -> None:
    create_key(sessions, "acme", "user")
    assert authenticate(sessions, "bst_guess") is None


def test_bad_role_is_refused(sessions: sessionmaker[Session]) -> None:
    with pytest.raises(ValueError, match="role must be one of"):
        create_key(sessions, "acme", "root")


def test_expired_key_is_rejected(sessions: sessionmaker[Session]) -> None:
    from datetime import timedelta

    from gateway.db.models import utc_now

    secret, _ = create_key(sessions, "acme", "user", expires_at=utc_now() - timedelta(seconds=1))
    assert authenticate(sessions, secret) is None
    fresh, _ = create_key(sessions, "acme", "user", expires_at=utc_now() + timedelta(hours=1))
    assert authenticate(sessions, fresh) is not None


def test_rotation_gives_a_new_secret_with_the_same_tenant_role_and_limits(
    sessions: sessionmaker[Session],
) -> None:
    from gateway.keys.store import rotate_key

    old_secret, old = create_key(sessions, "acme", "admin", requests_per_minute=7)
    rotated = rotate_key(sessions, old.key_id)
    assert rotated is not None
    new_secret, new = rotated
    assert authenticate(sessions, old_secret) is None
    found = authenticate(sessions, new_secret)
    assert found == new and (new.tenant, new.role, new.requests_per_minute) == ("acme", "admin", 7)
    assert rotate_key(sessions, old.key_id) is None  # a revoked key cannot be rotated again
