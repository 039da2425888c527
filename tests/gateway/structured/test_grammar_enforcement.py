"""The keyword table of docs/api.md, measured on xgrammar with SmolLM2's tokenizer: what
the gate lets through the grammar enforces (it rejects every violating answer), what the
gate refuses the grammar would let through, and what it lets through compiles in under a
second. A new xgrammar that changes any of this fails here."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import xgrammar as xgr

from engine.grammar import Grammars
from engine.types import Constraint
from gateway.policy.schema import StructuredOutputLimits
from gateway.structured import SchemaRefused, check_client_schema, validator_for
from tests.gateway.structured.test_schema_check import RICH, Person, linked_list

LIMITS = StructuredOutputLimits()


def grammar_accepts(grammars: Grammars, schema: dict[str, Any], answer: str) -> bool:
    """Whether the constraint lets the whole of `answer` be generated."""
    matcher = xgr.GrammarMatcher(grammars.compile(Constraint("json_schema", json.dumps(schema))))
    return bool(matcher.accept_string(answer)) and bool(matcher.is_completed())


def jsonschema_accepts(schema: dict[str, Any], answer: str) -> bool:
    return validator_for(schema).is_valid(json.loads(answer))


# (keyword, schema, answers that meet it, answers that break it)
ENFORCED: list[tuple[str, dict[str, Any], list[str], list[str]]] = [
    (
        "minLength/maxLength",
        {"type": "string", "minLength": 2, "maxLength": 3},
        ['"ab"'],
        ['"a"', '"abcd"'],
    ),
    ("pattern", {"type": "string", "pattern": "^[a-c]+$"}, ['"abc"'], ['"abd"', '""']),
    (
        "format",
        {"type": "string", "format": "uuid"},
        ['"123e4567-e89b-12d3-a456-426614174000"'],
        ['"x"'],
    ),
    ("minimum/maximum", {"type": "integer", "minimum": 3, "maximum": 10}, ["3", "10"], ["2", "11"]),
    (
        "exclusiveMinimum/Maximum",
        {"type": "number", "exclusiveMinimum": 1.5, "exclusiveMaximum": 2.5},
        ["1.6", "2"],
        ["1.5", "2.5"],
    ),
    ("multipleOf", {"type": "integer", "multipleOf": 3}, ["6"], ["4"]),
    (
        "minItems/maxItems",
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
        ["[1]"],
        ["[]", "[1,2,3]"],
    ),
    (
        "prefixItems",
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        ['[1,"a"]'],
        ['["a",1]', '[1,"a",2]'],
    ),
    (
        "minProperties/maxProperties",
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "minProperties": 1,
            "maxProperties": 2,
        },
        ['{"a":1}'],
        ["{}", '{"a":1,"b":2,"c":3}'],
    ),
    (
        "required",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        ['{"a":1}'],
        ["{}"],
    ),
    (
        "additionalProperties",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        },
        ['{"a":1,"b":"x"}'],
        ['{"a":1,"b":2}'],
    ),
    (
        "patternProperties",
        {
            "type": "object",
            "patternProperties": {"^x[0-9]$": {"type": "integer"}},
            "additionalProperties": False,
        },
        ['{"x1":1}'],
        ['{"x1":"s"}', '{"y":1}'],
    ),
    (
        "propertyNames",
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "propertyNames": {"pattern": "^[a-z]+$"},
        },
        ['{"ab":1}'],
        ['{"A1":1}'],
    ),
    (
        "unevaluatedProperties",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "unevaluatedProperties": False,
        },
        ['{"a":1}'],
        ['{"a":1,"b":2}'],
    ),
    (
        "unevaluatedItems",
        {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
        ["[1]"],
        ["[1,2]"],
    ),
    ("const", {"const": {"a": [1, "x"]}}, ['{"a":[1,"x"]}'], ['{"a":[1]}']),
    ("enum", {"enum": ["a", 1, None]}, ['"a"', "1", "null"], ['"b"', "2"]),
    ("type list", {"type": ["integer", "null"], "minimum": 3}, ["3", "null"], ["2", '"a"']),
    (
        "anyOf",
        {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]},
        ["1", '"a"'],
        ['"ab"', "true"],
    ),
    ("allOf of one", {"allOf": [{"type": "integer", "minimum": 3}]}, ["3"], ["2"]),
    (
        "$ref",
        {
            "$defs": {"n": {"type": "integer", "minimum": 0}},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/n"}},
            "required": ["a"],
        },
        ['{"a":1}'],
        ['{"a":-1}'],
    ),
    (
        "recursive $ref",
        linked_list(),
        ['{"value":1,"next":{"value":2,"next":null}}'],
        ['{"value":1,"next":{"value":"x","next":null}}'],
    ),
]


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"), [c[1:] for c in ENFORCED], ids=[c[0] for c in ENFORCED]
)
def test_what_the_gate_lets_through_the_grammar_enforces(
    grammars: Grammars, schema: dict[str, Any], valid: list[str], invalid: list[str]
) -> None:
    check_client_schema(schema, LIMITS, "schema")
    for answer in valid:
        assert grammar_accepts(grammars, schema, answer), answer
        assert jsonschema_accepts(schema, answer), answer
    for answer in invalid:
        assert not grammar_accepts(grammars, schema, answer), answer


# (keyword, schema, an answer the grammar lets through that breaks the schema)
LEAKS: list[tuple[str, dict[str, Any], str]] = [
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1,1]"),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
    (
        "oneOf (overlapping)",
        {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]},
        "1",
    ),
    ("not", {"type": "integer", "not": {"const": 3}}, "3"),
    ("if/then/else", {"type": "integer", "if": {"minimum": 5}, "then": {"multipleOf": 2}}, "7"),
    (
        "dependentRequired",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
        },
        '{"a":1}',
    ),
    ("allOf of two", {"allOf": [{"type": "integer"}, {"minimum": 3}]}, "2"),
    ("untyped maxLength", {"maxLength": 1}, '"ab"'),
    ("untyped minimum", {"minimum": 3}, "2"),
    ("beside anyOf", {"type": "integer", "anyOf": [{"minimum": 3}, {"maximum": -3}]}, "0"),
    ("beside $ref", {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3}, "2"),
    ("beside enum", {"type": "string", "enum": ["a", "bbb"], "maxLength": 2}, '"bbb"'),
    ("enum of another type", {"type": "string", "enum": ["a", 1]}, "1"),
    ("pattern with maxLength", {"type": "string", "pattern": "^a+$", "maxLength": 2}, '"aaa"'),
    ("format with pattern", {"type": "string", "format": "email", "pattern": "^z"}, '"a@b.co"'),
    ("multipleOf on a number", {"type": "number", "multipleOf": 0.5}, "1.3"),
    (
        "required, undeclared",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
        '{"a":1}',
    ),
    (
        "property matching a patternProperties key",
        {
            "type": "object",
            "properties": {"a1": {"type": "integer"}},
            "patternProperties": {"^a[0-9]$": {"type": "integer", "minimum": 5}},
        },
        '{"a1":1}',
    ),
    (
        "$anchor reference",
        {"$defs": {"n": {"$anchor": "num", "type": "integer"}}, "$ref": "#num"},
        '"x"',
    ),
    ("lookahead", {"type": "string", "pattern": "^(?=b)a$"}, '"a"'),
    ("format regex", {"type": "string", "format": "regex"}, '"("'),
]


@pytest.mark.parametrize(("schema", "answer"), [c[1:] for c in LEAKS], ids=[c[0] for c in LEAKS])
def test_what_the_grammar_would_let_through_the_gate_refuses(
    grammars: Grammars, schema: dict[str, Any], answer: str
) -> None:
    assert grammar_accepts(grammars, schema, answer)
    assert not _draft_accepts(schema, answer)
    with pytest.raises(SchemaRefused):
        check_client_schema(schema, LIMITS, "schema")


def _draft_accepts(schema: dict[str, Any], answer: str) -> bool:
    """Draft 2020-12's verdict, with the formats asserted (jsonschema's alone for the
    keywords the answer validator refuses to read, such as `$anchor`)."""
    from jsonschema import Draft202012Validator

    checker = Draft202012Validator.FORMAT_CHECKER
    return bool(Draft202012Validator(schema, format_checker=checker).is_valid(json.loads(answer)))


# Schemas the gate accepts that are hostile to a backtracking matcher, or near the
# compile-cost budget (measured 140-550 ms): each compiles within a second of CPU.
COSTLY: list[tuple[str, dict[str, Any]]] = [
    ("^(a+)+$", {"type": "string", "pattern": "^(a+)+$"}),
    ("^(a|a)*$", {"type": "string", "pattern": "^(a|a)*$"}),
    (
        "patternProperties ^(a+)+$",
        {
            "type": "object",
            "patternProperties": {"^(a+)+$": {"type": "integer"}},
            "additionalProperties": False,
        },
    ),
    ("recursive $ref", linked_list()),
    ("nested ranged repetition at the budget", {"type": "string", "pattern": "^(.{1,4}){1,4}$"}),
    (
        "15 email formats",
        {
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "format": "email"} for i in range(15)},
        },
    ),
    ("a wide class", {"type": "string", "pattern": '^[^"]{1,60}$'}),
    ("the rich schema", RICH),
    ("a pydantic model", Person.model_json_schema()),
]


@pytest.mark.parametrize("schema", [c[1] for c in COSTLY], ids=[c[0] for c in COSTLY])
def test_what_the_gate_lets_through_compiles_within_a_second(
    grammars: Grammars, schema: dict[str, Any]
) -> None:
    check_client_schema(schema, LIMITS, "schema")
    started = time.process_time()  # CPU, not wall: the test machine is shared
    grammars.compile(Constraint("json_schema", json.dumps(schema)))
    assert time.process_time() - started < 1.0
