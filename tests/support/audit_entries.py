"""An audit entry of a chat request, as the audit log's tests write them."""

from __future__ import annotations

from gateway.audit.log import AuditEntry


def entry(name: str, subject: str = "key_a", text_kept: bool = False) -> AuditEntry:
    """A chat request's entry named `name`, for `subject` (its key), its text kept (sealed)
    or not."""
    return AuditEntry(
        request_id=name,
        endpoint="/v1/chat/completions",
        outcome="ok",
        status_code=200,
        tenant="acme",
        key_id=subject,
        prompt_text=f"prompt of {name}",
        answer_text=f"answer of {name}",
        store_content=text_kept,
    )
