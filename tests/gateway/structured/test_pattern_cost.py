"""The compile-cost estimate of a pattern: nested ranged repetition is what costs, and
constructs the constraint would ignore are refused."""

from __future__ import annotations

import pytest

from gateway.structured.pattern_cost import BASE, NARROW, WIDE, PatternRefused, pattern_cost

LIMIT = 10**12


def test_loops_cost_little_whatever_their_nesting() -> None:
    # A backtracking matcher's worst case; an automaton's easy one.
    assert pattern_cost("^(a+)+$", LIMIT) == BASE + 1
    assert pattern_cost("^[a-z0-9]+(?:-[a-z0-9]+)*$", LIMIT) == BASE + 2 * NARROW + 1


def test_counted_repetition_multiplies_and_a_variable_body_multiplies_again() -> None:
    assert pattern_cost("^.{16}$", LIMIT) == BASE + 16 * WIDE
    assert pattern_cost("^([a-z]{10}){10}$", LIMIT) == BASE + 100 * NARROW
    # 4.7 s of CPU to compile: the ten-way choice inside each of five copies.
    assert pattern_cost("^(.{1,10}){1,5}$", LIMIT) == BASE + WIDE * 10 * 5 * 5


def test_alternatives_cost_at_least_a_class() -> None:
    letters = "|".join("abcdefghijklmnopqrstuvwxyz")
    assert pattern_cost(f"^({letters}){{100}}$", LIMIT) == BASE + 100 * NARROW
    assert pattern_cost('^[^"]{4}$', LIMIT) == BASE + 4 * WIDE


def test_escapes_braces_and_named_groups_are_read_as_one_atom() -> None:
    assert pattern_cost("^\\u0041{3}$", LIMIT) == BASE + 3
    assert pattern_cost("^\\d{3}-\\d{4}$", LIMIT) == BASE + 7 * NARROW + 1
    assert pattern_cost("^a{,3}$", LIMIT) == BASE + 5  # not a count: the brace is literal
    assert pattern_cost("^(?<year>\\d{4})$", LIMIT) == BASE + 4 * NARROW


def test_the_estimate_stops_growing_past_the_limit() -> None:
    assert pattern_cost("^((((.{1000}){1000}){1000}){1000})$", 50_000) == 50_001


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("^(?=b)a$", "lookaround"),
        ("^(?!a)\\w$", "lookaround"),
        ("^a(?<=a)$", "lookaround"),
        ("\\bword\\b", "word boundaries"),
        ("^(a)\\1$", "back-references"),
        ("^\\p{L}+$", "Unicode property classes"),
        ("^[\\p{L}]+$", "Unicode property classes"),
        ("(?i)^a$", "inline flags"),
        ("^a)$", "unbalanced"),
        ("^(a$", "not closed"),
    ],
)
def test_constructs_the_constraint_ignores_or_misreads_are_refused(
    pattern: str, reason: str
) -> None:
    with pytest.raises(PatternRefused, match=reason):
        pattern_cost(pattern, LIMIT)
