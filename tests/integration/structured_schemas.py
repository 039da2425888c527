"""Schemas a client might send as `response_format`, each with a question that fits it:
nested objects, arrays with bounds, enums, const, anyOf, nullable types, patterns and
numeric bounds."""

from __future__ import annotations

from typing import Any

SCHEMA_CASES: list[tuple[str, str, dict[str, Any]]] = [
    (
        "city",
        "Give the capital of France and its population.",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
            "required": ["name", "population"],
            "additionalProperties": False,
        },
    ),
    (
        "person",
        "Invent a person with a first name, a last name and an age.",
        {
            "type": "object",
            "properties": {
                "first_name": {"type": "string", "minLength": 1, "maxLength": 30},
                "last_name": {"type": "string", "minLength": 1, "maxLength": 30},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
            },
            "required": ["first_name", "last_name", "age"],
            "additionalProperties": False,
        },
    ),
    (
        "sentiment",
        "A customer review says the product works great and they love it. How positive is it?",
        {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["sentiment", "confidence"],
            "additionalProperties": False,
        },
    ),
    (
        "shopping_list",
        "Write a shopping list for a pancake breakfast.",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 40},
                    "minItems": 2,
                    "maxItems": 6,
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
    ),
    (
        "order",
        "Create an order of two books for a customer named Ada.",
        {
            "type": "object",
            "properties": {
                "customer": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}},
                    "required": ["name", "vip"],
                    "additionalProperties": False,
                },
                "lines": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "title": {"type": "string", "maxLength": 60},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 10},
                        },
                        "required": ["title", "quantity"],
                        "additionalProperties": False,
                    },
                    "minItems": 1,
                    "maxItems": 3,
                },
            },
            "required": ["customer", "lines"],
            "additionalProperties": False,
        },
    ),
    (
        "version",
        "What is the version of the software, written as major.minor.patch?",
        {
            "type": "object",
            "properties": {
                "version": {"type": "string", "pattern": "^[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}$"}
            },
            "required": ["version"],
            "additionalProperties": False,
        },
    ),
    (
        "const_kind",
        "Describe a cat as an animal record.",
        {
            "type": "object",
            "properties": {
                "kind": {"const": "animal"},
                "name": {"type": "string", "maxLength": 30},
                "legs": {"type": "integer", "minimum": 0, "maximum": 8},
            },
            "required": ["kind", "name", "legs"],
            "additionalProperties": False,
        },
    ),
    (
        "nullable",
        "Give the middle name of Isaac Newton, or null if he had none.",
        {
            "type": "object",
            "properties": {
                "first": {"type": "string"},
                "middle": {"type": ["string", "null"]},
                "last": {"type": "string"},
            },
            "required": ["first", "middle", "last"],
            "additionalProperties": False,
        },
    ),
    (
        "any_of",
        "Give either a number or a word for how many moons the Earth has.",
        {
            "type": "object",
            "properties": {
                "answer": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 20}]}
            },
            "required": ["answer"],
            "additionalProperties": False,
        },
    ),
    (
        "temperature",
        "Report today's temperature in Paris in Celsius.",
        {
            "type": "object",
            "properties": {
                "celsius": {"type": "number", "minimum": -50, "maximum": 60},
                "unit": {"const": "C"},
            },
            "required": ["celsius", "unit"],
            "additionalProperties": False,
        },
    ),
    (
        "email_contact",
        "Make up a contact card for a support desk.",
        {
            "type": "object",
            "properties": {
                "team": {"type": "string", "maxLength": 40},
                "hours": {"type": "string", "pattern": "^[0-9]{2}:[0-9]{2}-[0-9]{2}:[0-9]{2}$"},
                "channels": {
                    "type": "array",
                    "items": {"enum": ["chat", "phone", "email"]},
                    "minItems": 1,
                    "maxItems": 3,
                },
            },
            "required": ["team", "hours", "channels"],
            "additionalProperties": False,
        },
    ),
    (
        "matrix",
        "Give a 2 by 2 identity matrix.",
        {
            "type": "object",
            "properties": {
                "rows": {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": -9, "maximum": 9},
                        "minItems": 2,
                        "maxItems": 2,
                    },
                    "minItems": 2,
                    "maxItems": 2,
                }
            },
            "required": ["rows"],
            "additionalProperties": False,
        },
    ),
    (
        "ticket",
        "File a bug ticket: the login page crashes on submit.",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 5, "maxLength": 80},
                "severity": {"enum": ["low", "medium", "high", "critical"]},
                "steps": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 80},
                    "maxItems": 4,
                },
                "regression": {"type": "boolean"},
            },
            "required": ["title", "severity", "steps", "regression"],
            "additionalProperties": False,
        },
    ),
    (
        "optional_fields",
        "Describe the weather in one word, and optionally the wind speed.",
        {
            "type": "object",
            "properties": {
                "summary": {"type": "string", "maxLength": 20},
                "wind_kmh": {"type": "integer", "minimum": 0, "maximum": 300},
            },
            "required": ["summary"],
            "additionalProperties": False,
        },
    ),
    (
        "date_parts",
        "When did the first moon landing happen?",
        {
            "type": "object",
            "properties": {
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                "month": {"type": "integer", "minimum": 1, "maximum": 12},
                "day": {"type": "integer", "minimum": 1, "maximum": 31},
            },
            "required": ["year", "month", "day"],
            "additionalProperties": False,
        },
    ),
    (
        "yes_no",
        "Is the sky blue on a clear day?",
        {
            "type": "object",
            "properties": {
                "answer": {"type": "boolean"},
                "reason": {"type": "string", "maxLength": 80},
            },
            "required": ["answer", "reason"],
            "additionalProperties": False,
        },
    ),
    (
        "defs_ref",
        "Give the home and work addresses of a fictional person.",
        {
            "$defs": {
                "address": {
                    "type": "object",
                    "properties": {
                        "street": {"type": "string", "maxLength": 40},
                        "city": {"type": "string", "maxLength": 30},
                    },
                    "required": ["street", "city"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {
                "home": {"$ref": "#/$defs/address"},
                "work": {"$ref": "#/$defs/address"},
            },
            "required": ["home", "work"],
            "additionalProperties": False,
        },
    ),
    (
        "top_level_array_wrapped",
        "List three primary colours.",
        {
            "type": "object",
            "properties": {
                "colours": {
                    "type": "array",
                    "items": {"enum": ["red", "yellow", "blue", "green"]},
                    "minItems": 3,
                    "maxItems": 3,
                }
            },
            "required": ["colours"],
            "additionalProperties": False,
        },
    ),
    (
        "price",
        "How much does a coffee cost in euros?",
        {
            "type": "object",
            "properties": {
                "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                "currency": {"enum": ["EUR", "USD"]},
            },
            "required": ["amount", "currency"],
            "additionalProperties": False,
        },
    ),
    (
        "one_of_shape",
        "Describe a circle with radius 2.",
        {
            "type": "object",
            "properties": {
                "shape": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {
                                "kind": {"const": "circle"},
                                "radius": {"type": "number", "minimum": 0, "maximum": 1000},
                            },
                            "required": ["kind", "radius"],
                            "additionalProperties": False,
                        },
                        {
                            "type": "object",
                            "properties": {
                                "kind": {"const": "square"},
                                "side": {"type": "number", "minimum": 0, "maximum": 1000},
                            },
                            "required": ["kind", "side"],
                            "additionalProperties": False,
                        },
                    ]
                }
            },
            "required": ["shape"],
            "additionalProperties": False,
        },
    ),
    (
        "tags",
        "Tag this article about electric cars with up to three keywords.",
        {
            "type": "object",
            "properties": {
                "keywords": {
                    "type": "array",
                    "items": {"type": "string", "pattern": "^[a-z-]{2,20}$"},
                    "minItems": 1,
                    "maxItems": 3,
                },
                "language": {"const": "en"},
            },
            "required": ["keywords", "language"],
            "additionalProperties": False,
        },
    ),
    (
        "invoice_total",
        "Write an invoice summary with a number, a total and whether it is paid.",
        {
            "type": "object",
            "properties": {
                "number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
                "total": {"type": "number", "minimum": 0, "maximum": 100000},
                "paid": {"type": "boolean"},
                "note": {"type": ["string", "null"], "maxLength": 60},
            },
            "required": ["number", "total", "paid", "note"],
            "additionalProperties": False,
        },
    ),
]
