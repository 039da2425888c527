"""Structured outputs: the gate client JSON Schemas pass before they are compiled, and the
validator that checks an answer against one."""

from gateway.structured.answer_validator import AnswerValidator, validator_for
from gateway.structured.errors import SchemaRefused
from gateway.structured.schema_check import SchemaLimits, check_client_schema

__all__ = [
    "AnswerValidator",
    "SchemaLimits",
    "SchemaRefused",
    "check_client_schema",
    "validator_for",
]
