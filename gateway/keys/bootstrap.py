"""First-start conveniences: a usable API key for the default tenant."""

from __future__ import annotations

import os

from sqlalchemy.orm import Session, sessionmaker

from gateway.keys.store import authenticate, create_key
from gateway.settings import Settings


def ensure_default_key(settings: Settings, sessions: sessionmaker[Session]) -> str:
    """Return the default tenant's starter key, creating it when there is none.

    The database keeps only its hash; the secret is also written to a file in the data
    folder, readable by its owner only, so that a later `serve` can show it again.
    Delete that file once the key is stored elsewhere (a new one is made next start).
    """
    key_file = settings.default_key_file
    if key_file.is_file():
        secret = key_file.read_text().strip()
        if authenticate(sessions, secret) is not None:
            return secret
    secret, _ = create_key(sessions, settings.default_tenant, "user")
    key_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    return secret
