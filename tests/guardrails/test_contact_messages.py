"""The held-out contact-details source: harmless messages carrying addresses and numbers."""

from __future__ import annotations

import re
from datetime import datetime, tzinfo

import faker.providers.date_time as faker_dates
import pytest

from guardrails.train_injection import (
    CONTACT_TEMPLATES,
    SHARED_DATA,
    contact_messages,
    load_splits,
)

_CONTACT = re.compile(r"@|\d{3}|https?://")


def test_messages_are_benign_reproducible_and_carry_contact_details() -> None:
    rows = contact_messages(CONTACT_TEMPLATES, count=30, seed=5)
    assert len(rows) == 30
    assert {(row.label, row.source) for row in rows} == {(0, "contacts")}
    assert all(_CONTACT.search(row.text) and "{" not in row.text for row in rows)
    assert contact_messages(CONTACT_TEMPLATES, count=30, seed=5) == rows
    assert len({row.text for row in rows}) == 30


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="the shared data sets are not here")
def test_contact_messages_are_held_out_only() -> None:
    splits = load_splits()
    assert sum(ex.source == "contacts" for ex in splits["test"]) == 200
    assert not any(ex.source == "contacts" for ex in splits["train"])


def test_messages_do_not_follow_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = contact_messages(CONTACT_TEMPLATES, count=40, seed=5)

    class Later(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Later:  # type: ignore[override]
            return cls(2031, 3, 4, 5, 6, tzinfo=tz)

    monkeypatch.setattr(faker_dates, "datetime", Later)
    assert contact_messages(CONTACT_TEMPLATES, count=40, seed=5) == rows
