"""API keys: shown once, stored as a hash, found again by their secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.keys import authenticate, create_key, hash_key
from gateway.models import ApiKey
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
