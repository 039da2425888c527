"""What each supported keyword's value must be under Draft 2020-12's meta-schema.

The gate checks these itself, one step per keyword, instead of running jsonschema's
`check_schema`: that walks the meta-schema's `$dynamicRef` chain for every subschema
(3.2 s for a 56 KB schema of 3,500 `{"type": "null"}` branches, on the event loop).
Every keyword outside the supported set is refused anyway, so the value shapes below are
what is left of the meta-schema; the tests check both agree.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.structured.document import Path, json_path
from gateway.structured.errors import SchemaProblem

TYPE_NAMES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})


def _is_schema(value: object) -> bool:
    return isinstance(value, dict | bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value >= 0
        and float(value).is_integer()
    )


def _is_step(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _is_unique_strings(value: object) -> bool:
    return (
        isinstance(value, list)
        and all(isinstance(item, str) for item in value)
        and len(set(value)) == len(value)
    )


def _is_type(value: object) -> bool:
    if isinstance(value, str):
        return value in TYPE_NAMES
    return (
        isinstance(value, list)
        and bool(value)
        and _is_unique_strings(value)
        and set(value) <= TYPE_NAMES
    )


# Each shape: its test and how the refusal says what was expected.
_Shape = tuple[Callable[[object], bool], str]
_SCHEMA: _Shape = (_is_schema, "a schema (an object or a boolean)")
_SCHEMAS: _Shape = (
    lambda v: isinstance(v, list) and bool(v) and all(_is_schema(item) for item in v),
    "a non-empty array of schemas",
)
_SCHEMA_MAP: _Shape = (
    lambda v: isinstance(v, dict) and all(_is_schema(item) for item in v.values()),
    "an object of schemas",
)
_COUNT: _Shape = (_is_count, "a non-negative integer")
_NUMBER: _Shape = (_is_number, "a number")
_STRING: _Shape = (lambda v: isinstance(v, str), "a string")
_BOOLEAN: _Shape = (lambda v: isinstance(v, bool), "a boolean")
_ARRAY: _Shape = (lambda v: isinstance(v, list), "an array")
_ANY: _Shape = (lambda v: True, "any value")

SHAPES: dict[str, _Shape] = {
    **dict.fromkeys(("title", "description", "$comment", "$schema", "$id", "$ref"), _STRING),
    **dict.fromkeys(("format", "pattern"), _STRING),
    **dict.fromkeys(("deprecated", "readOnly", "writeOnly"), _BOOLEAN),
    **dict.fromkeys(("default", "const"), _ANY),
    **dict.fromkeys(("examples", "enum"), _ARRAY),
    **dict.fromkeys(("$defs", "definitions", "properties", "patternProperties"), _SCHEMA_MAP),
    **dict.fromkeys(("anyOf", "allOf", "prefixItems"), _SCHEMAS),
    **dict.fromkeys(
        ("items", "unevaluatedItems", "additionalProperties", "unevaluatedProperties"), _SCHEMA
    ),
    "propertyNames": _SCHEMA,
    **dict.fromkeys(
        ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"),
        _COUNT,
    ),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"), _NUMBER),
    "multipleOf": (_is_step, "a number above 0"),
    "required": (_is_unique_strings, "an array of distinct strings"),
    "type": (_is_type, f"a type name ({', '.join(sorted(TYPE_NAMES))}) or an array of them"),
}


def check_value(keyword: str, value: object, path: Path) -> None:
    """Refuse a keyword whose value the meta-schema does not allow."""
    test, expected = SHAPES[keyword]
    if not test(value):
        raise SchemaProblem(
            f"invalid JSON Schema at {json_path((*path, keyword))}: '{keyword}' must be {expected}"
        )
