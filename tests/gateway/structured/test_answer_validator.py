"""The answer check: jsonschema's reading of the schema, without backtracking without end,
network fetches or a RecursionError on a deep answer."""

from __future__ import annotations

import time
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing.exceptions import Unresolvable

from gateway.structured import validator_for
from gateway.structured.answer_validator import CHECK_BUDGET_S, MAX_ANSWER_DEPTH


def errors(schema: dict[str, Any], answer: object) -> list[str]:
    return [error.validator for error in validator_for(schema).iter_errors(answer)]


@pytest.mark.parametrize(
    ("pattern", "answer"), [("^(a+)+$", "a" * 30 + "b"), ("^(a|a)*$", "a" * 28 + "b")]
)
def test_a_backtracking_pattern_cannot_hang_the_check(pattern: str, answer: str) -> None:
    # `^(a|a)*$` runs for minutes in `regex` without its timeout; the answer is withheld.
    start = time.perf_counter()
    assert errors({"type": "string", "pattern": pattern}, answer) == ["pattern"]
    assert time.perf_counter() - start < 1.0


def test_many_slow_matches_share_one_time_budget() -> None:
    # Each match takes a few milliseconds, under the per-match timeout; 500 of them would
    # take seconds.
    patterns = {f"^{prefix}?(a|a)*$": {"type": "integer"} for prefix in "bcdefghijk"}
    schema = {"type": "object", "patternProperties": patterns, "additionalProperties": False}
    answer = {"a" * 14 + str(i): i for i in range(50)}
    start = time.perf_counter()
    found = list(validator_for(schema).iter_errors(answer))
    assert time.perf_counter() - start < CHECK_BUDGET_S + 0.5
    assert [error.validator for error in found] == ["pattern"]
    assert "took more than" in found[0].message


def test_patterns_decide_as_jsonschema_does() -> None:
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "[0-9]{3}"}},
        "patternProperties": {"^x_": {"type": "integer"}},
        "additionalProperties": {"type": "boolean"},
        "propertyNames": {"pattern": "^[a-z_0-9]+$"},
    }
    answers = [
        {"code": "a123b"},
        {"code": "12"},
        {"x_1": 1, "other": True},
        {"x_1": "one"},
        {"other": 1},
        {"Other": True},
    ]
    reference = Draft202012Validator(schema)
    for answer in answers:
        expected = sorted(error.validator for error in reference.iter_errors(answer))
        assert sorted(errors(schema, answer)) == expected, answer


def test_additional_properties_false_names_no_answer_text() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    found = list(validator_for(schema).iter_errors({"a": 1, "secret@example.com": 2}))
    assert [error.validator for error in found] == ["additionalProperties"]
    assert "secret" not in found[0].message


def test_a_remote_reference_is_not_fetched() -> None:
    validator = validator_for({"$ref": "https://example.com/schema.json"})
    start = time.perf_counter()
    with pytest.raises(Unresolvable):
        validator.is_valid(1)
    assert time.perf_counter() - start < 0.5


def test_a_deep_answer_to_a_recursive_schema_is_one_error() -> None:
    tree = {
        "$defs": {
            "t": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                "required": ["kids"],
            }
        },
        "$ref": "#/$defs/t",
    }
    answer: dict[str, Any] = {"kids": []}
    for _ in range(MAX_ANSWER_DEPTH):  # twice as deep: an object and an array each level
        answer = {"kids": [answer]}
    assert errors(tree, answer) == ["maxDepth"]
    shallow: dict[str, Any] = {"kids": []}
    for _ in range(20):
        shallow = {"kids": [shallow]}
    assert validator_for(tree).is_valid(shallow)


def test_formats_jsonschema_knows_are_checked() -> None:
    # The grammar writes dates by shape; the calendar is checked here.
    assert errors({"type": "string", "format": "date"}, "2024-02-30") == ["format"]
    assert errors({"type": "string", "format": "date"}, "2024-02-03") == []
    assert errors({"type": "string", "format": "ipv4"}, "01.2.3.4") == ["format"]
