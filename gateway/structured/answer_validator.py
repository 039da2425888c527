"""Checking an answer against the client's schema without any step that can run away.

jsonschema matches `pattern` with Python's backtracking `re` (`^(a+)+$` against
"aaa...ab" never ends) and fetches a remote `$ref` over the network by default. Here
patterns match with the `regex` module under a timeout, and all of one answer's matches
within CHECK_BUDGET_S (many keys against many patterns could each run just under a
per-match timeout); a check that runs out of time is an error, so the answer is withheld,
never passed unchecked. References resolve only inside the schema, and an answer nested
deeper than MAX_ANSWER_DEPTH is one error rather than a RecursionError (a recursive schema
lets an answer nest as deep as its tokens go).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import regex
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from referencing import Registry

PATTERN_TIMEOUT_S = 0.05
CHECK_BUDGET_S = 0.25
# jsonschema spends about three frames per level of an answer.
MAX_ANSWER_DEPTH = 100


class AnswerValidator:
    """A Draft 2020-12 validator of answers; `iter_errors` and `is_valid` as jsonschema's."""

    def __init__(self, validator: Validator) -> None:
        self._validator = validator

    def iter_errors(self, instance: Any) -> Iterator[ValidationError]:
        if _deeper_than(instance, MAX_ANSWER_DEPTH):
            yield ValidationError(
                f"the answer nests deeper than {MAX_ANSWER_DEPTH} levels", validator="maxDepth"
            )
            return
        # Collected here, not yielded as found: the deadline holds for the whole check.
        token = _DEADLINE.set(time.monotonic() + CHECK_BUDGET_S)
        try:
            errors = list(self._validator.iter_errors(instance))
        except _TooSlow:
            errors = [
                ValidationError(
                    f"the schema's patterns took more than {CHECK_BUDGET_S:g} s to check",
                    validator="pattern",
                )
            ]
        finally:
            _DEADLINE.reset(token)
        yield from errors

    def is_valid(self, instance: Any) -> bool:
        return next(self.iter_errors(instance), None) is None


def validator_for(schema: Mapping[str, Any] | bool) -> AnswerValidator:
    """The validator of answers to `schema` (one that passed `check_client_schema`)."""
    return AnswerValidator(
        _SafeValidator(
            schema,
            registry=Registry(),  # no retrieval: a reference outside the schema fails
            format_checker=Draft202012Validator.FORMAT_CHECKER,
        )
    )


class _TooSlow(Exception):
    """A pattern match ran out of the answer check's time."""


_DEADLINE: ContextVar[float] = ContextVar("answer_check_deadline")


def _search(pattern: str, text: str) -> bool:
    remaining = _DEADLINE.get(time.monotonic() + CHECK_BUDGET_S) - time.monotonic()
    if remaining <= 0:
        raise _TooSlow
    try:
        found = regex.search(pattern, text, timeout=min(PATTERN_TIMEOUT_S, remaining))
    except TimeoutError:
        raise _TooSlow from None
    return found is not None


# Keyword functions get jsonschema's validator object, whose `descend` its Validator
# protocol does not declare: it stays Any here.
def _pattern(
    validator: Any, pattern: str, instance: object, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if isinstance(instance, str) and not _search(pattern, instance):
        # Not the answer's text: the message may be logged or shown, the answer may hold PII.
        yield ValidationError(f"the string does not match {pattern!r}")


def _pattern_properties(
    validator: Any,
    patterns: Mapping[str, Any],
    instance: object,
    schema: Mapping[str, Any],
) -> Iterator[ValidationError]:
    if not isinstance(instance, dict):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _search(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(
    validator: Any, allowed: Any, instance: object, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not isinstance(instance, dict):
        return
    declared = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [
        name
        for name in instance
        if name not in declared and not any(_search(p, name) for p in patterns)
    ]
    if isinstance(allowed, dict):
        for name in extras:
            yield from validator.descend(instance[name], allowed, path=name)
    elif allowed is False and extras:
        yield ValidationError(f"{len(extras)} properties are not allowed here")


_SafeValidator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


def _deeper_than(value: object, limit: int) -> bool:
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False
