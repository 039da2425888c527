"""The auditor API's record model: every column of the table, and the values exactly as
the chain hashes and the export writes them (no coercion on the way out)."""

from __future__ import annotations

from gateway.audit.query import EXPORT_COLUMNS, AuditFilter, read_records
from gateway.audit.routes import AuditRecordView
from guardrails.verdict import Verdict
from tests.gateway.audit.test_chain import entry, open_log


def test_the_view_has_every_column_of_the_table() -> None:
    assert list(AuditRecordView.model_fields) == EXPORT_COLUMNS


def test_a_record_reads_back_unchanged_through_the_view(database_url: str) -> None:
    _, sessions, log = open_log(database_url)
    full = entry(7)
    full.verdicts = [Verdict("pii", "redact", 0.85, ("EMAIL x1",))]
    full.chunk_ids, full.latency_ms, full.details = [3, 4], 12.0, {"documents": ["d1"]}
    full.prompt_text, full.answer_text, full.store_content = "user: hi", "hello", True
    log.record(entry(1))
    log.record(full)
    records = list(read_records(sessions, AuditFilter(tenant="acme")))
    assert len(records) == 2
    for record in records:
        assert AuditRecordView.model_validate(record).model_dump(mode="json") == record
    assert records[1]["prompt_text"] == "user: hi"  # decrypted for the reviewer
