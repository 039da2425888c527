"""Crypto-shredding for the text kept in the audit log.

Prompt and answer text is encrypted (AES-256-GCM) with a key of its own per data subject:
the end user the client named, else the API key. The chain hashes the ciphertext, so
erasing a subject's key makes their text unreadable while every record still verifies.
Keys live in `audit_subject_keys` (`gateway.db.models.AuditSubjectKey`), which, unlike
`audit_records`, may be updated.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import Connection, bindparam, insert, select, tuple_, update
from sqlalchemy.orm import Session

from gateway.db.models import AuditSubjectKey, utc_now

ENVELOPE = "bastion-enc:v1:"
ERASED = "[erased]"
UNREADABLE = "[unreadable]"
_NONCE_BYTES = 12


@dataclass(frozen=True, slots=True)
class ErasedKey:
    """One key that `erase` destroyed."""

    key_id: int
    tenant: str
    subject: str


# Encrypts one text with the key it was made for.
Sealer = Callable[[str], str]

# The live keys of a batch's subjects, from one statement built once: the audit writer
# reads them for every batch, and building the query each time cost more than running it.
_LIVE_SUBJECT_KEYS = select(
    AuditSubjectKey.id, AuditSubjectKey.tenant, AuditSubjectKey.subject, AuditSubjectKey.key
).where(
    tuple_(AuditSubjectKey.tenant, AuditSubjectKey.subject).in_(
        bindparam("subjects", expanding=True)
    ),
    AuditSubjectKey.erased_at.is_(None),
)
_NEW_KEY = insert(AuditSubjectKey).returning(AuditSubjectKey.id)


def _seal(key_id: int, key: bytes, plaintext: str) -> str:
    nonce = os.urandom(_NONCE_BYTES)
    sealed = AESGCM(key).encrypt(nonce, plaintext.encode(), _aad(key_id))
    return f"{ENVELOPE}{key_id}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def is_sealed(stored: str | None) -> bool:
    return stored is not None and stored.startswith(ENVELOPE)


def sealers_in(
    db: Connection, subjects: Collection[tuple[str, str]]
) -> dict[tuple[str, str], Sealer]:
    """A function for each `(tenant, subject)` that encrypts text with its live key, read
    (or created) in `db`'s transaction, the one that writes the records: the records
    `AuditLog` writes together cost one lookup, and an erasure made by another process
    holds from the next write on. A key another writer created meanwhile fails the
    insert, and the caller retries the transaction."""
    if not subjects:
        return {}
    live: dict[tuple[str, str], tuple[int, bytes]] = {}
    for row in db.execute(_LIVE_SUBJECT_KEYS, {"subjects": list(subjects)}):
        if row.key is not None:
            live[(row.tenant, row.subject)] = (int(row.id), bytes(row.key))
    for tenant, subject in set(subjects) - live.keys():
        key = AESGCM.generate_key(bit_length=256)
        created = db.execute(_NEW_KEY, {"tenant": tenant, "subject": subject, "key": key})
        live[(tenant, subject)] = (int(created.scalar_one()), key)
    return {pair: partial(_seal, *key) for pair, key in live.items()}


def erase_keys_in(session: Session, subject: str, tenant: str | None) -> list[ErasedKey]:
    """Destroy the subject's live keys (in `tenant`, or in every tenant when None) inside
    the caller's transaction."""
    query = select(AuditSubjectKey).where(
        AuditSubjectKey.subject == subject, AuditSubjectKey.erased_at.is_(None)
    )
    if tenant is not None:
        query = query.where(AuditSubjectKey.tenant == tenant)
    rows = list(session.scalars(query))
    if rows:
        session.execute(
            update(AuditSubjectKey)
            .where(AuditSubjectKey.id.in_([r.id for r in rows]))
            .values(key=None, erased_at=utc_now())
        )
    return [ErasedKey(r.id, r.tenant, r.subject) for r in rows]


class TextOpener:
    """Decrypts envelopes for one read (a page, an export), caching keys for that read only,
    so an erased key is never served from memory afterwards."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._keys: dict[int, bytes | None] = {}

    def open(self, stored: str | None) -> str | None:
        """Plain text, `[erased]` when the key is gone, or the value as stored when it
        was never sealed."""
        if stored is None or not is_sealed(stored):
            return stored
        key_part, _, payload = stored[len(ENVELOPE) :].partition(":")
        if not key_part.isdigit():
            return UNREADABLE
        key_id = int(key_part)
        key = self._key(key_id)
        if key is None:
            return ERASED
        try:
            raw = base64.urlsafe_b64decode(payload)
            plain = AESGCM(key).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _aad(key_id))
        except (InvalidTag, ValueError):
            return UNREADABLE
        return plain.decode()

    def _key(self, key_id: int) -> bytes | None:
        if key_id not in self._keys:
            found = self._session.scalar(
                select(AuditSubjectKey.key).where(AuditSubjectKey.id == key_id)
            )
            self._keys[key_id] = None if found is None else bytes(found)
        return self._keys[key_id]


def _aad(key_id: int) -> bytes:
    return f"bastion.audit.text.v1:{key_id}".encode()
