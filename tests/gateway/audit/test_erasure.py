"""Crypto-shredding: a subject's text is sealed with their key; erasing the key makes it
unreadable while every record still verifies, and other subjects are untouched."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gateway.audit.chain import verify_chain
from gateway.audit.log import AuditEntry, AuditLog
from gateway.audit.query import AuditFilter, read_record, read_records
from gateway.audit.retention import ERASURE_EVENT, erase_subject
from gateway.audit.subject_keys import ERASED
from gateway.db.models import AuditRecord, AuditSubjectKey
from tests.gateway.audit.test_chain import open_log


def chat(n: int, end_user: str | None, key_id: str = "key_1") -> AuditEntry:
    return AuditEntry(
        request_id=f"req_{n}",
        endpoint="/v1/chat/completions",
        outcome="ok",
        status_code=200,
        tenant="acme",
        key_id=key_id,
        end_user=end_user,
        prompt_text=f"question {n} from {end_user or key_id}",
        answer_text=f"answer {n}",
        store_content=True,
    )


def texts(sessions: sessionmaker[Session], **where: str) -> dict[str, str | None]:
    return {
        r["request_id"]: r["prompt_text"]
        for r in read_records(sessions, AuditFilter(tenant="acme", **where))
    }


def test_erasing_a_subject_shreds_only_their_text(database_url: str) -> None:
    engine, sessions, log = open_log(database_url)
    log.record(chat(1, "alice"))
    log.record(chat(2, "bob"))
    log.record(chat(3, "alice"))
    log.record(chat(4, None, key_id="key_9"))

    with sessions() as session:
        stored = list(session.scalars(select(AuditRecord).order_by(AuditRecord.seq)))
    assert all("question" not in (r.prompt_text or "") for r in stored)  # sealed at rest
    assert texts(sessions)["req_1"] == "question 1 from alice"
    one = read_record(sessions, 4, "acme")
    assert one is not None and one["answer_text"] == "answer 4"

    result = erase_subject(sessions, "alice", "acme", "test")

    assert len(result.keys) == 1 and result.records[0].event == ERASURE_EVENT
    assert result.records[0].details["subject"] == "alice"
    readable = texts(sessions)
    assert readable["req_1"] == readable["req_3"] == ERASED
    assert readable["req_2"] == "question 2 from bob"
    assert readable["req_4"] == "question 4 from key_9"
    report = verify_chain(sessions)
    assert report.ok, report.problems
    with sessions() as session:
        keys = {k.subject: k for k in session.scalars(select(AuditSubjectKey))}
        after = list(session.scalars(select(AuditRecord).order_by(AuditRecord.seq)))
    assert keys["alice"].key is None and keys["alice"].erased_at is not None
    assert keys["bob"].key is not None
    assert [r.prompt_sha256 for r in after[:4]] == [r.prompt_sha256 for r in stored]

    # Alice comes back: her new text gets a new key; the old text stays erased.
    log.record(chat(5, "alice"))
    assert texts(sessions, end_user="alice") == {
        "req_1": ERASED,
        "req_3": ERASED,
        "req_5": "question 5 from alice",
    }
    assert verify_chain(sessions).ok
    engine.dispose()


def test_erasure_is_recorded_even_when_nothing_was_stored(sqlite_url: str) -> None:
    engine, sessions, _ = open_log(sqlite_url)
    result = erase_subject(sessions, "nobody", None, "test")
    assert result.keys == [] and len(result.records) == 1
    assert result.records[0].details == {"actor": "test", "subject": "nobody", "keys_erased": []}
    assert verify_chain(sessions).ok
    engine.dispose()


def test_text_is_not_kept_when_the_policy_says_so(sqlite_url: str) -> None:
    engine, sessions, log = open_log(sqlite_url)
    entry = chat(1, "carol")
    entry.store_content = False
    log.record(entry)
    with sessions() as session:
        row = session.scalars(select(AuditRecord)).one()
        assert row.prompt_text is None and row.prompt_sha256 is not None
        assert session.scalar(select(AuditSubjectKey.id)) is None  # no key made for nothing
    engine.dispose()


def test_writers_in_two_processes_seal_a_subject_with_one_key(database_url: str) -> None:
    """The key is read in the transaction that writes the record: a second writer (another
    replica, the CLI) finds the key the first created instead of making its own, and one
    erasure shreds what both wrote."""
    engine, sessions, first = open_log(database_url)
    second = AuditLog(sessions)
    first.record(chat(1, "alice"))
    second.record(chat(2, "alice"))
    first.record(chat(3, "alice"))
    with sessions() as session:
        keys = list(session.scalars(select(AuditSubjectKey)))
    assert [k.subject for k in keys] == ["alice"]
    assert texts(sessions)["req_2"] == "question 2 from alice"
    erase_subject(sessions, "alice", "acme", "test")
    assert set(texts(sessions, end_user="alice").values()) == {ERASED}
    second.record(chat(4, "alice"))  # after the erasure: a new key, readable text
    assert texts(sessions, end_user="alice")["req_4"] == "question 4 from alice"
    assert verify_chain(sessions).ok
    engine.dispose()
