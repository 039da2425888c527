"""The gate for client JSON Schemas: hostile schemas are refused quickly with a message
naming the keyword and its path; real schemas (pydantic's, the openai client's) pass."""

from __future__ import annotations

import datetime
import enum
import time
from typing import Any, Literal

import openai
import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, Field

from gateway.policy.schema import StructuredOutputLimits
from gateway.structured import SchemaRefused, check_client_schema
from gateway.structured.keyword_values import SHAPES
from gateway.structured.keywords import SUPPORTED

LIMITS = StructuredOutputLimits()
WHERE = "response_format.json_schema.schema"


def refusal(schema: object, limits: StructuredOutputLimits = LIMITS) -> str:
    """The refusal's message; the check must answer within a second of CPU whatever the
    schema (CPU time, so that other jobs on a shared machine don't count)."""
    start = time.process_time()
    with pytest.raises(SchemaRefused) as caught:
        check_client_schema(schema, limits, WHERE)
    assert time.process_time() - start < 1.0
    assert caught.value.param == WHERE
    return caught.value.message


def accept(schema: object, limits: StructuredOutputLimits = LIMITS) -> None:
    start = time.process_time()
    check_client_schema(schema, limits, WHERE)
    assert time.process_time() - start < 1.0


def nested_objects(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def linked_list() -> dict[str, Any]:
    node = {
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
        },
        "required": ["value", "next"],
    }
    return {"$defs": {"node": node}, "$ref": "#/$defs/node"}


RICH = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Person",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40, "description": "d"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-z]+$"},
            "minItems": 1,
            "maxItems": 5,
        },
        "kind": {"enum": ["a", "b", "c"]},
        "status": {"type": "string", "const": "ok"},
        "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "score": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "point": {
            "type": "array",
            "prefixItems": [{"type": "number"}, {"type": "number"}],
            "items": False,
        },
        "home": {"$ref": "#/$defs/Address", "description": "where"},
        "extra": {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "propertyNames": {"pattern": "^[a-z]{1,10}$"},
            "maxProperties": 3,
        },
        "step": {"type": "integer", "multipleOf": 5},
        "when": {"type": "string", "format": "date-time"},
        "work": {"allOf": [{"$ref": "#/$defs/Address"}]},
        "codes": {
            "type": "object",
            "patternProperties": {"^x[0-9]$": {"type": "boolean"}},
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
    "$defs": {
        "Address": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"},
            },
            "required": ["city"],
        }
    },
}


def test_a_rich_schema_with_every_supported_kind_of_keyword_passes() -> None:
    accept(RICH)
    Draft202012Validator.check_schema(RICH)


class Colour(enum.StrEnum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    city: str = Field(description="City name", max_length=40)
    zip: str = Field(pattern=r"^\d{5}$")


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=150)
    colour: Colour
    kind: Literal["a", "b"]
    tags: list[str] = Field(max_length=3)
    nick: str | None = None
    address: Address = Field(description="Where they live")
    others: list[Address]
    born: datetime.date
    seen: datetime.datetime
    scores: dict[str, int]
    ratio: float = Field(gt=0, lt=1)
    parent: Person | None = None


def test_pydantic_and_openai_client_schemas_pass() -> None:
    accept(Person.model_json_schema())
    tool = openai.pydantic_function_tool(Person)
    accept(tool["function"]["parameters"])


# Each hostile schema, and what its refusal must say.
HOSTILE: list[tuple[str, object, str]] = [
    ("depth 300", nested_objects(300), "nests deeper than 32 levels at $.properties.a"),
    (
        "100k-entry enum",
        {"enum": [f"value{i}" for i in range(100_000)]},
        "larger than 65536 bytes (structured_output.max_schema_bytes)",
    ),
    (
        "100k-entry enum in a nested property",
        {
            "type": "object",
            "properties": {
                "a": {
                    "type": "object",
                    "properties": {"b": {"type": "string", "enum": [str(i) for i in range(10**5)]}},
                }
            },
        },
        "larger than 65536 bytes",
    ),
    (
        "1 MB schema",
        {
            "type": "object",
            "properties": {f"p{i}": {"description": "d" * 1000} for i in range(1000)},
        },
        "larger than 65536 bytes",
    ),
    (
        "remote $ref",
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}},
        "'$ref' 'https://example.com/a.json' at $.properties.a is not supported: only "
        "references inside the schema (#/...) are; remote references are refused",
    ),
    ("invalid type", {"type": 12}, "invalid JSON Schema at $.type: 'type' must be a type name"),
    (
        "unsupported keyword",
        {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
        "'uniqueItems' at $.properties.tags is not supported",
    ),
    (
        "huge minItems",
        {"type": "array", "items": {"type": "integer"}, "minItems": 10**9},
        "'minItems' at $ is above 1000 (structured_output.max_required_count)",
    ),
    (
        "patternProperties with a hostile regex",
        {"type": "object", "patternProperties": {"^(.{1,10}){1,100}$": {"type": "integer"}}},
        'the patternProperties key "^(.{1,10}){1,100}$" at $ would take too long to compile',
    ),
    (
        "nested counted repetition",
        {"type": "string", "pattern": "^(.{1,10}){1,5}$"},
        "'pattern' at $ would take too long to compile",
    ),
    (
        "256 email formats",
        {
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "format": "email"} for i in range(256)},
        },
        "the schema would take too long to compile",
    ),
    (
        "3,500 anyOf branches (check_schema alone takes 3 s on these)",
        {"anyOf": [{"type": "null"} for _ in range(3500)]},
        "structured_output.max_compile_cost",
    ),
    (
        "a $ref cycle that never reaches a property",
        {"anyOf": [{"$ref": "#"}, {"type": "integer"}]},
        "the '$ref' cycle $ -> $.anyOf[0] -> $ never reaches a property or an item",
    ),
    (
        "a reference to nothing",
        {"$ref": "#/$defs/missing"},
        "'$ref' '#/$defs/missing' at $ points at nothing",
    ),
    ("a root that is not an object", [{"type": "string"}], "the schema must be a JSON object"),
    ("a non-finite number", {"type": "number", "maximum": float("inf")}, "not finite"),
]


@pytest.mark.parametrize(
    ("schema", "message"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_hostile_schemas_are_refused_quickly_naming_the_problem(
    schema: object, message: str
) -> None:
    assert message in refusal(schema)


def test_the_enum_limit_holds_when_the_size_limit_is_raised() -> None:
    roomy = StructuredOutputLimits(max_schema_bytes=10**7, max_compile_cost=10**9)
    schema = {"type": "string", "enum": [f"v{i}" for i in range(100_000)]}
    assert "more than 1024 enum values" in refusal(schema, roomy)


def test_a_huge_property_count_is_refused() -> None:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}}
    assert "more than 256 properties (at $; structured_output.max_properties)" in refusal(schema)


def test_recursive_refs_follow_the_policy() -> None:
    accept(linked_list())
    accept({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}})
    closed = StructuredOutputLimits(allow_recursive_refs=False)
    message = refusal(linked_list(), closed)
    assert "recursive schemas are off in this policy" in message
    assert '$["$defs"].node' in message


def test_local_refs_resolve_json_pointers() -> None:
    accept({"$defs": {"a/b": {"type": "integer"}}, "$ref": "#/$defs/a~1b"})
    accept({"$defs": {"a b": {"type": "integer"}}, "$ref": "#/$defs/a%20b"})
    accept({"definitions": {"n": {"type": "integer"}}, "$ref": "#/definitions/n"})
    accept({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/anyOf/0"}}]})
    assert "only JSON pointers" in refusal({"$defs": {"n": {"type": "integer"}}, "$ref": "#n"})
    assert "'$ref' '#/$defs' at $ does not point at a schema" in refusal(
        {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs"}
    )


def test_matching_properties_against_hostile_patterns_has_one_time_budget() -> None:
    # 128 names, each slow against each of 128 patterns: minutes with a per-match timeout.
    schema = {
        "type": "object",
        "properties": {"a" * 26 + str(i): {"type": "integer"} for i in range(128)},
        "patternProperties": {f"^(x{i})?(a|a)*$": {"type": "integer"} for i in range(128)},
    }
    assert "takes too long to match the declared property names" in refusal(schema)


def test_the_hostile_backtracking_regex_is_accepted_as_an_automaton() -> None:
    accept({"type": "string", "pattern": "^(a+)+$"})
    accept({"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}})


# Keywords xgrammar ignores in these places (docs/api.md has each measurement).
NOT_ENFORCED: list[tuple[str, object, str]] = [
    (
        "oneOf",
        {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "'oneOf' at $ is not supported",
    ),
    ("not", {"type": "integer", "not": {"const": 3}}, "'not' at $ is not supported"),
    ("if", {"type": "integer", "if": {"minimum": 5}}, "'if' at $ is not supported"),
    ("contains", {"type": "array", "contains": {"const": 5}}, "'contains' at $ is not supported"),
    (
        "dependentRequired",
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        "'dependentRequired' at $ is not supported",
    ),
    ("nullable", {"type": "integer", "nullable": True}, 'use "type": [..., "null"]'),
    ("unknown keyword", {"type": "string", "x-kind": "name"}, "'x-kind' at $ is not a keyword"),
    (
        "keyword without its type",
        {"type": "object", "properties": {"a": {"maxLength": 3}}},
        '\'maxLength\' at $.properties.a needs "type": "string" in the same schema',
    ),
    (
        "keyword beside anyOf",
        {"type": "integer", "anyOf": [{"minimum": 3}, {"maximum": -3}]},
        "'type' beside 'anyOf' at $ is ignored by the constraint",
    ),
    (
        "keyword beside $ref",
        {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3},
        "'minimum' beside '$ref' at $ is ignored",
    ),
    (
        "allOf of two",
        {"allOf": [{"type": "integer"}, {"type": "integer", "minimum": 3}]},
        "'allOf' at $ with more than one schema is not enforced",
    ),
    (
        "keyword beside enum",
        {"type": "string", "enum": ["a", "bbb"], "maxLength": 2},
        "'maxLength' beside 'enum' at $ is ignored",
    ),
    (
        "enum value of another type",
        {"type": "string", "enum": ["a", 1]},
        "the enum value 1 at $ is not of the schema's type ['string']",
    ),
    (
        "pattern and maxLength",
        {"type": "string", "pattern": "^a+$", "maxLength": 3},
        "'pattern' and 'minLength/maxLength' at $ cannot be combined",
    ),
    (
        "pattern and format",
        {"type": "string", "pattern": "^z", "format": "email"},
        "'pattern' and 'format' at $ cannot be combined",
    ),
    (
        "multipleOf on a number",
        {"type": "number", "multipleOf": 0.5},
        '\'multipleOf\' at $ is enforced only for "type": "integer"',
    ),
    (
        "required but not declared",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
        "'required' at $ names \"b\", which is not in its 'properties'",
    ),
    (
        "a property that also matches a patternProperties key",
        {
            "type": "object",
            "properties": {"a1": {"type": "string"}},
            "patternProperties": {"^a[0-9]$": {"type": "integer"}},
        },
        'property "a1" at $ also matches the patternProperties key "^a[0-9]$"',
    ),
    (
        "a format it does not enforce",
        {"type": "string", "format": "regex"},
        "'format': \"regex\" at $ is not enforced by the constraint",
    ),
    ("lookahead", {"type": "string", "pattern": "^(?=b)a$"}, "lookaround at position 1"),
    (
        "a $ref in propertyNames",
        {
            "type": "object",
            "propertyNames": {"$ref": "#/$defs/n"},
            "$defs": {"n": {"type": "string"}},
        },
        "not enforced on property names",
    ),
    (
        "$id below the root",
        {"type": "object", "properties": {"a": {"$id": "https://x.test/a", "type": "integer"}}},
        "'$id' at $.properties.a is allowed only at the schema's root",
    ),
    ("false as a property", {"type": "object", "properties": {"a": False}}, "admits no value"),
    ("an empty enum", {"enum": []}, "the empty 'enum' at $ admits no value"),
    (
        "an integer bound with a fraction",
        {"type": "integer", "minimum": 2.5},
        "'minimum' at $ must be a whole number",
    ),
    (
        "unevaluatedProperties with patternProperties",
        {
            "type": "object",
            "patternProperties": {"^a$": {"type": "integer"}},
            "unevaluatedProperties": False,
        },
        "'unevaluatedProperties' at $ cannot be used in a schema with patternProperties",
    ),
]


@pytest.mark.parametrize(
    ("schema", "message"), [c[1:] for c in NOT_ENFORCED], ids=[c[0] for c in NOT_ENFORCED]
)
def test_what_the_constraint_would_ignore_is_refused_by_name(schema: object, message: str) -> None:
    assert message in refusal(schema)


# Schemas Draft 2020-12 itself rejects: the gate refuses each without jsonschema's own
# check (which costs seconds on a large schema), and agrees with it.
INVALID = [
    {"type": 12},
    {"type": "text"},
    {"type": []},
    {"type": ["string", "string"]},
    {"type": "string", "minLength": -1},
    {"type": "string", "maxLength": 1.5},
    {"type": "integer", "minimum": "0"},
    {"type": "integer", "multipleOf": 0},
    {"type": "object", "required": "a"},
    {"type": "object", "required": ["a", "a"], "properties": {"a": {}}},
    {"type": "object", "properties": {"a": 3}},
    {"type": "object", "properties": []},
    {"anyOf": []},
    {"anyOf": {"type": "integer"}},
    {"type": "array", "items": [{"type": "integer"}]},
    {"type": "array", "prefixItems": []},
    {"enum": "a"},
    {"type": "string", "pattern": "(a"},
    {"title": 3},
    {"$ref": 3},
    {"description": None},
    {"type": "string", "format": 5},
]


@pytest.mark.parametrize("schema", INVALID, ids=[str(s) for s in INVALID])
def test_invalid_schemas_are_refused_as_draft_2020_12_refuses_them(schema: object) -> None:
    with pytest.raises(SchemaError):
        Draft202012Validator.check_schema(schema)
    message = refusal(schema)
    assert "invalid JSON Schema at $" in message or "not a valid regular expression" in message


def test_every_supported_keyword_has_its_value_checked() -> None:
    assert set(SHAPES) == SUPPORTED


def test_the_refusal_names_where_the_request_held_the_schema() -> None:
    where = "tools[0].function.parameters"
    with pytest.raises(SchemaRefused) as caught:
        check_client_schema({"type": "array", "uniqueItems": True}, LIMITS, where)
    assert caught.value.param == where
    assert str(caught.value) == caught.value.message
