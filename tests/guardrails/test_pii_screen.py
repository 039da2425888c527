"""The PII check's screen: with only entities that need a digit, an "@" or a ":", a text
without any of them skips the analyzer, and finds exactly what the analyzer would."""

from __future__ import annotations

import pytest
from presidio_analyzer import AnalyzerEngine

from guardrails.config import CustomRecognizer, PiiConfig
from guardrails.pii import PiiRedactor

TEXTS = (
    # nothing the screen lets through
    "Our refund policy covers annual plans bought through the web shop.",
    "Write to john dot doe at example dot com, or call five five five, one two three.",
    "The IBAN starts with GB and WEST, the card with four ones, the social with five.",
    "Ask Maria Rossi in Lisbon about the quarterly report before Friday.",
    "Host dead beef cafe answered; the gateway at fe eighty did not.",
    # fullwidth letters, then fullwidth digits further down
    "\uff25\uff4d\uff41\uff49\uff4c \uff4d\uff45 \uff41\uff54 "
    "\uff57\uff4f\uff52\uff4b \uff50\uff4c\uff45\uff41\uff53\uff45",
    # what it sends on, with and without findings
    "Write to john.doe@example.com or call 555 123 4567 today.",
    "card 4111 1111 1111 1111, ssn 536-22-1234, iban GB82 WEST 1234 5698 7654 32",
    "Reach the box at 10.0.0.1 when the VPN is down.",
    "Its other address is dead:beef::cafe, on the lab network.",
    "Version 2.4.1 ships on Monday; see ticket 4471 for details.",
    "Note: bring your badge.",
    "Call \uff10\uff12\uff10 \uff17\uff19\uff14\uff16 \uff10\uff10\uff11\uff18 "
    "from the London office.",
)


@pytest.fixture(scope="module")
def unscreened(analyzer: AnalyzerEngine) -> PiiRedactor:
    """The default entities with a custom recognizer that never matches, which turns the
    screen off."""
    never = CustomRecognizer(entity="NEVER_FOUND", patterns=[r"(?!x)x"])
    return PiiRedactor(analyzer, PiiConfig(custom_recognizers=[never]))


def test_screened_findings_equal_the_analyzers(
    redactor: PiiRedactor, unscreened: PiiRedactor
) -> None:
    assert redactor._screened and not unscreened._screened
    found = 0
    for text in TEXTS:
        findings = redactor.analyze(text)
        assert findings == unscreened.analyze(text), text
        found += len(findings)
    assert found >= 8  # the corpus holds PII the analyzer finds


def test_custom_recognizers_and_names_turn_the_screen_off(analyzer: AnalyzerEngine) -> None:
    code = CustomRecognizer(entity="PROJECT_CODE", patterns=[r"\bPRJ-[A-Z]{4}\b"])
    custom = PiiRedactor(analyzer, PiiConfig(custom_recognizers=[code]))
    assert [f.entity_type for f in custom.analyze("Bill it to PRJ-ABCD please.")] == [
        "PROJECT_CODE"
    ]
    names = PiiRedactor(analyzer, PiiConfig(entities=["EMAIL_ADDRESS", "PERSON"]))
    assert "PERSON" in {f.entity_type for f in names.analyze("Ask Maria Rossi about it.")}
