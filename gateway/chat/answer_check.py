"""The last check of a JSON answer: after the output checks it must still parse, and meet
the client's schema (a redacted value may no longer fit it). Such an answer is withheld,
never sent invalid."""

from __future__ import annotations

import json
from typing import Any

from gateway.structured import validator_for
from guardrails.verdict import Verdict

CHECK_NAME = "structured_output"
_MAX_PROBLEMS = 3


def check_json_answer(text: str, schema: dict[str, Any] | None) -> Verdict:
    """Allow when `text` is JSON (valid under `schema` when there is one), else block."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return _block(f"the answer is not JSON after the output checks ({exc.msg})")
    except RecursionError:
        return _block("the answer nests too deeply to check")
    if schema is None:
        if not isinstance(value, dict):
            return _block("the answer is not a JSON object")
        return Verdict(CHECK_NAME, "allow", 0.0, (), "enforce")
    # The keyword and path, not the message: messages quote the value, which is answer text.
    problems = [
        f"{error.json_path} fails '{error.validator}'"
        for error in validator_for(schema).iter_errors(value)
    ][:_MAX_PROBLEMS]
    if problems:
        return _block(
            "after the output checks the answer no longer matches the schema: "
            + "; ".join(problems)
        )
    return Verdict(CHECK_NAME, "allow", 0.0, (), "enforce")


def _block(reason: str) -> Verdict:
    return Verdict(CHECK_NAME, "block", 1.0, (reason,), "enforce")
