"""A verdict as the audit record keeps it: every field, as plain JSON values."""

from __future__ import annotations

import json
from dataclasses import fields

from guardrails.verdict import Verdict


def test_a_verdicts_dict_holds_every_field_as_json() -> None:
    verdict = Verdict("pii", "redact", 0.87, ("EMAIL_ADDRESS at 6-28",), "warn")

    data = verdict.to_dict()

    assert set(data) == {f.name for f in fields(Verdict)}  # a new field is not left out
    assert data == {
        "check": "pii",
        "action": "redact",
        "score": 0.87,
        "evidence": ["EMAIL_ADDRESS at 6-28"],
        "mode": "warn",
    }
    assert json.loads(json.dumps(data)) == data
    assert Verdict(**{**data, "evidence": tuple(data["evidence"])}) == verdict
