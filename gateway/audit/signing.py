"""The key that signs audit checkpoints: `BASTION_AUDIT_SIGNING_KEY` (`Settings`), else a
key file that is generated once in the data folder, readable by its owner only."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import structlog
from pydantic import SecretStr

log = structlog.get_logger(__name__)

KEY_FILE_NAME = "audit-signing.key"


class SigningKeyError(RuntimeError):
    """The signing key file exists but cannot be used."""


def load_signing_key(data_dir: Path, configured: SecretStr | None) -> bytes:
    """The configured key, or the data folder's key file (created with mode 0600)."""
    if configured is not None and configured.get_secret_value():
        return configured.get_secret_value().encode()
    path = data_dir / KEY_FILE_NAME
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: two processes starting together must not each write a different key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_key_file(path)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    log.info("audit.signing_key_created", path=str(path))
    return _read_key_file(path)


def _read_key_file(path: Path) -> bytes:
    if path.stat().st_mode & 0o077:
        log.warning("audit.signing_key_readable_by_others", path=str(path))
    key = path.read_text().strip()
    if not key:
        raise SigningKeyError(
            f"The audit signing key file {path} is empty; delete it to generate a new key or "
            "set BASTION_AUDIT_SIGNING_KEY."
        )
    return key.encode()
