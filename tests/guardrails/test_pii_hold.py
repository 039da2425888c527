"""How much of a streamed answer's end the PII check keeps back (`PiiRedactor.hold_from`).

Each case is a held text (ending after whitespace) and the part of it that must stay held,
because the next words could make it an entity or give one its context. Every other word
may go out now.
"""

from __future__ import annotations

import pytest
from presidio_analyzer import AnalyzerEngine

from guardrails.config import CustomRecognizer, PiiConfig
from guardrails.pii import PiiRedactor

HELD_ENDS = [
    ("Sure, here is the answer you asked for. ", ""),
    ("Call me at 555 123 ", "Call me at 555 123 "),  # "call" gives bare digits their score
    ("The office number is +44 20 ", "number is +44 20 "),
    ("Pay it into GB82 WEST 1234 ", "GB82 WEST 1234 "),
    ("Pay it into GB ", "GB "),  # a country code before its check digits
    (
        "Our release notes for version ",
        "release notes for version ",
    ),  # "version 10.2.0.1" is no address
    (
        "The social security number of the new employee is ",
        "social security number of the new employee is ",
    ),
    ("It is at the end of the day so ", "so "),
    ("Reach the desk (212) ", "Reach the desk (212) "),
    # "cc" in "according" is a card's context word, but a card's checksum decides alone.
    ("According to the handbook, employees ", ""),
]


@pytest.fixture(scope="module")
def default_entities(analyzer: AnalyzerEngine) -> PiiRedactor:
    return PiiRedactor(analyzer, PiiConfig())


@pytest.mark.parametrize(("text", "held"), HELD_ENDS)
def test_the_end_that_may_still_be_an_entity_or_its_context_is_held(
    default_entities: PiiRedactor, text: str, held: str
) -> None:
    hold = default_entities.hold_from(text)
    assert hold is not None
    assert text[hold:] == held


@pytest.mark.parametrize(
    "config",
    [
        PiiConfig(entities=["EMAIL_ADDRESS", "PERSON"]),
        PiiConfig(
            custom_recognizers=[CustomRecognizer(entity="EMPLOYEE_ID", patterns=[r"EMP \d{6}"])]
        ),
    ],
    ids=["names", "custom pattern"],
)
def test_entities_that_can_take_any_word_leave_it_to_the_window(
    analyzer: AnalyzerEngine, config: PiiConfig
) -> None:
    assert PiiRedactor(analyzer, config).hold_from("Sure, here is the answer. ") is None


def test_context_words_count_only_where_a_finding_may_need_one(analyzer: AnalyzerEngine) -> None:
    """At 0.4, ten bare digits (0.1) need "number" near them; at 0.05 every pattern is over
    the threshold on its own, so no word before an entity decides it."""
    text = "Here is the number "
    assert PiiRedactor(analyzer, PiiConfig()).hold_from(text) == len("Here is the ")
    lenient = PiiRedactor(analyzer, PiiConfig(score_threshold=0.05))
    assert lenient.hold_from(text) == len(text)
