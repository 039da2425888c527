"""What a client schema may say: the JSON Schema keywords xgrammar 0.2.9 enforces, found by
compiling schemas and checking that the matcher rejects violating answers (the table in
docs/api.md, "Structured outputs: supported JSON Schema keywords"). A keyword outside these
sets is refused, never ignored: an ignored keyword would give an answer the client's own
validator rejects.
"""

from __future__ import annotations

# Keywords that describe and never constrain.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "examples",
        "default",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
# Only at the root: elsewhere `$id` would move the base of every `$ref` below it.
ROOT_ONLY = frozenset({"$schema", "$id"})
# Hold subschemas that apply only where a `$ref` names them.
DEFINITIONS = frozenset({"$defs", "definitions"})

STRING_KEYWORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KEYWORDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
)
ARRAY_KEYWORDS = frozenset({"items", "prefixItems", "minItems", "maxItems", "unevaluatedItems"})
OBJECT_KEYWORDS = frozenset(
    {
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "unevaluatedProperties",
    }
)
VALUE_KEYWORDS = frozenset({"type", "enum", "const"})
COMBINATORS = frozenset({"anyOf", "allOf", "$ref"})

SUPPORTED = (
    ANNOTATIONS
    | ROOT_ONLY
    | DEFINITIONS
    | STRING_KEYWORDS
    | NUMBER_KEYWORDS
    | ARRAY_KEYWORDS
    | OBJECT_KEYWORDS
    | VALUE_KEYWORDS
    | COMBINATORS
)

# xgrammar ignores these unless the same schema's `type` names their type (measured: an
# untyped {"maxLength": 1} lets "ab" through). Keywords not listed work untyped.
NEEDS_TYPE: dict[str, tuple[str, ...]] = {
    **{keyword: ("string",) for keyword in STRING_KEYWORDS},
    **{keyword: ("integer", "number") for keyword in NUMBER_KEYWORDS},
    "minItems": ("array",),
    "maxItems": ("array",),
    "patternProperties": ("object",),
}

# Why a keyword xgrammar does not enforce is refused, for the 400's message.
UNSUPPORTED: dict[str, str] = {
    "oneOf": "it is enforced only when its branches are provably disjoint; use anyOf",
    "not": "the constraint ignores it",
    "if": "the constraint ignores if/then/else",
    "then": "the constraint ignores if/then/else",
    "else": "the constraint ignores if/then/else",
    "uniqueItems": "the constraint ignores it",
    "contains": "the constraint does not enforce contains, minContains or maxContains",
    "minContains": "the constraint does not enforce contains, minContains or maxContains",
    "maxContains": "the constraint does not enforce contains, minContains or maxContains",
    "dependentRequired": "the constraint ignores it",
    "dependentSchemas": "the constraint ignores it",
    "dependencies": "it is not a Draft 2020-12 keyword (and the constraint ignores it)",
    "additionalItems": "it is not a Draft 2020-12 keyword; use prefixItems and items",
    "nullable": 'it is not a JSON Schema keyword; use "type": [..., "null"]',
    "discriminator": "it is an OpenAPI keyword the constraint ignores",
    "$anchor": "only JSON-pointer references (#/...) are supported",
    "$dynamicRef": "only $ref with a JSON pointer (#/...) is supported",
    "$dynamicAnchor": "only $ref with a JSON pointer (#/...) is supported",
    "$recursiveRef": "only $ref with a JSON pointer (#/...) is supported",
    "$recursiveAnchor": "only $ref with a JSON pointer (#/...) is supported",
    "$vocabulary": "custom vocabularies are not supported",
    "contentEncoding": "the constraint ignores it",
    "contentMediaType": "the constraint ignores it",
    "contentSchema": "the constraint ignores it",
}

# Formats xgrammar enforces (by shape: a date-time's calendar is not checked, so
# 2024-02-30 passes), each with its measured compile cost (units of pattern_cost.py).
FORMAT_COSTS: dict[str, int] = {
    "date-time": 100,
    "date": 50,
    "time": 50,
    "duration": 100,
    "uuid": 200,
    "ipv4": 100,
    "ipv6": 200,
    "hostname": 1_000,
    "email": 2_500,
    "uri": 2_500,
    "uri-reference": 2_500,
    "uri-template": 9_000,
    "json-pointer": 400,
    "relative-json-pointer": 400,
}

# Subschemas that constrain a property name (a string): only these keywords work there
# (a `$ref` inside propertyNames is ignored).
PROPERTY_NAME_KEYWORDS = ANNOTATIONS | STRING_KEYWORDS | VALUE_KEYWORDS
