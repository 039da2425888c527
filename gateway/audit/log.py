"""Writing the audit log: exactly one record per request, whatever its outcome."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy import Connection
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import AppendedRecord, AuditChain, AuditWriteError, RecordsBuilder
from gateway.audit.group_commit import GroupCommit
from gateway.audit.loop_commit import LoopGroupCommit
from gateway.audit.subject_keys import sealers_in
from guardrails.verdict import Verdict

log = structlog.get_logger(__name__)

# About as often as SQLite's own automatic checkpoint (1,000 pages of WAL), which the
# engine that writes on the event loop leaves off.
_CHECKPOINT_EVERY = 250


@dataclass
class AuditEntry:
    """What one request did; filled in as the request moves through the stages."""

    request_id: str
    endpoint: str
    event: str = "chat.completion"
    tenant: str | None = None
    key_id: str | None = None
    end_user: str | None = None
    policy_version: str | None = None
    model: str | None = None
    # The upstream server that answered (a base URL); None for the embedded engine.
    upstream: str | None = None
    outcome: str = "error"
    status_code: int = 500
    error_code: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    chunk_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    engine_ms: float = 0.0
    prompt_text: str | None = None
    answer_text: str | None = None
    store_content: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        """Whose text this is, for erasure: the end user the client named, else the key."""
        return self.end_user or self.key_id or "anonymous"

    @property
    def seal_as(self) -> tuple[str, str]:
        """The (tenant, subject) whose key seals the text."""
        return self.tenant or "", self.subject

    @property
    def seals_text(self) -> bool:
        """Whether the row keeps text, which must then be sealed."""
        return self.store_content and (self.prompt_text, self.answer_text) != (None, None)

    def to_row(self, seal: Callable[[str], str] | None = None) -> dict[str, Any]:
        """The row to append: text only when the policy allows it (sealed by `seal` when
        given), hashes of the plain text always."""
        keep = self.store_content
        return {
            "event": self.event,
            "request_id": self.request_id,
            "endpoint": self.endpoint,
            "tenant": self.tenant,
            "key_id": self.key_id,
            "end_user": self.end_user,
            "policy_version": self.policy_version,
            "model": self.model,
            "outcome": self.outcome,
            "status_code": self.status_code,
            "error_code": self.error_code,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "chunk_ids": list(self.chunk_ids),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_ms": round(self.latency_ms, 3),
            "engine_ms": round(self.engine_ms, 3),
            "prompt_sha256": _sha256(self.prompt_text),
            "answer_sha256": _sha256(self.answer_text),
            "prompt_text": _kept(self.prompt_text, keep, seal),
            "answer_text": _kept(self.answer_text, keep, seal),
            # In `details`, which the hash chain covers: no new column, so the records
            # written before it verify as they did.
            "details": self.details | ({"upstream": self.upstream} if self.upstream else {}),
        }


def _kept(text: str | None, keep: bool, seal: Callable[[str], str] | None) -> str | None:
    if text is None or not keep:
        return None
    return text if seal is None else seal(text)


def _sha256(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


class AuditLog:
    """Appends records, their text sealed with the subject's key; a failure to write is
    logged loudly and raised to the request it describes, never hidden.

    Records that wait at the same time are appended together (`GroupCommit`): one
    transaction links them along the chain in the order they came, each its own row,
    hash and seal, and each caller returns once its record has committed.
    """

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._chain = AuditChain(sessions)
        self._writer: GroupCommit[AuditEntry, AppendedRecord] = GroupCommit(
            self._write_batch, name="audit-writer"
        )
        self._on_loop: LoopGroupCommit[AuditEntry, AppendedRecord] | None = None
        if self._chain.appends_without_waiting:
            self._on_loop = LoopGroupCommit(self._write_batch_now, self._writer.submit)
        self._commits_on_loop = 0

    def record(self, entry: AuditEntry) -> AppendedRecord:
        """Append `entry`; returns its record once committed, blocking this thread until then."""
        return self._writer.submit(entry).result()

    async def record_async(self, entry: AuditEntry) -> AppendedRecord:
        """`record` for the event loop, without holding a thread: written on the loop where
        the database answers without waiting (a local SQLite file), else by the writer."""
        if self._on_loop is not None:
            return await self._on_loop.submit(entry)
        return await asyncio.wrap_future(self._writer.submit(entry))

    def _write_batch(self, entries: list[AuditEntry]) -> list[AppendedRecord | BaseException]:
        outcomes = self._linked(entries, self._chain.append_many)
        assert outcomes is not None, "append_many writes the batch or raises"
        return outcomes

    def _write_batch_now(
        self, entries: list[AuditEntry]
    ) -> list[AppendedRecord | BaseException] | None:
        """`_write_batch` on the event loop; None where it would have to wait. Every
        `_CHECKPOINT_EVERY` commits, a thread copies the WAL into the database file."""
        outcomes = self._linked(entries, self._chain.try_append_now)
        if outcomes is not None:
            self._commits_on_loop += 1
            if self._commits_on_loop % _CHECKPOINT_EVERY == 0:
                asyncio.get_running_loop().run_in_executor(None, self._checkpoint)
        return outcomes

    def _checkpoint(self) -> None:
        try:
            self._chain.checkpoint()
        except Exception:  # the next one copies what this one left; writes go on meanwhile
            log.warning("audit.checkpoint_failed", exc_info=True)

    def _linked(
        self,
        entries: list[AuditEntry],
        append: Callable[[RecordsBuilder], list[AppendedRecord] | None],
    ) -> list[AppendedRecord | BaseException] | None:
        """Seal each entry (a failure fails that entry alone), then link every sealed row
        in one transaction by `append` (a failure fails each of them; None when it wrote
        nothing without waiting). The subjects' keys are read in that transaction, on its
        connection: on the writer thread each statement waits for the event loop to hand
        back the GIL, so a batch makes as few as it can."""
        # An entry's error, or None where its row goes into the transaction.
        failures: list[BaseException | None] = []

        def rows_in(db: Connection) -> list[dict[str, Any]]:
            # A record whose text is not kept needs no key; the others share one lookup.
            sealers = sealers_in(db, {e.seal_as for e in entries if e.seals_text})
            failures.clear()
            rows = []
            for entry in entries:
                try:
                    rows.append(entry.to_row(sealers.get(entry.seal_as)))
                except Exception as exc:
                    log.exception("audit.write_failed", request_id=entry.request_id)
                    failures.append(_write_error(exc))
                    continue
                failures.append(None)
            return rows

        try:
            linked = append(rows_in)
        except Exception as exc:
            log.exception("audit.write_failed", request_ids=[e.request_id for e in entries])
            return [_write_error(exc) for _ in entries]
        if linked is None:
            return None
        appended = iter(linked)
        return [next(appended) if f is None else f for f in failures]


def _write_error(cause: Exception) -> AuditWriteError:
    """An error of its own for each waiter (one raised in many threads would gather all
    their tracebacks), naming the shared cause."""
    if isinstance(cause, AuditWriteError):
        error = AuditWriteError(*cause.args)
    else:
        error = AuditWriteError(f"could not append the audit record: {cause}")
    error.__cause__ = cause
    return error
