"""Names that spaCy's small model misses or mistypes, typed by the words around them;
and the structured formats presidio misread (IBAN before a word, IPv6 after "ping")."""

from __future__ import annotations

import pytest
from presidio_analyzer import AnalyzerEngine

from guardrails.config import PiiConfig
from guardrails.pii import PiiRedactor
from guardrails.pii_context import CONTEXT_SCORE, context_names

NAMES = ["PERSON", "LOCATION"]


@pytest.fixture(scope="module")
def names(analyzer: AnalyzerEngine) -> PiiRedactor:
    return PiiRedactor(analyzer, PiiConfig(entities=[*PiiConfig().entities, *NAMES]))


@pytest.mark.parametrize(
    ("text", "entity", "value"),
    [
        ("I spoke with Tobiasz Kunc yesterday.", "PERSON", "Tobiasz Kunc"),
        ("Ask Fabio Cocci for the keys.", "PERSON", "Fabio Cocci"),
        ("Myrthe Strijker will join the call.", "PERSON", "Myrthe Strijker"),
        ("Hi Clémence, the slides are attached.", "PERSON", "Clémence"),
        ("We are opening an office in Serpa.", "LOCATION", "Serpa"),
        ("Ship to Ostrowiec Świętokrzyski.", "LOCATION", "Ostrowiec Świętokrzyski"),
        ("She moved to Vila Nova de Famalicão last year.", "LOCATION", "Vila Nova de Famalicão"),
    ],
)
def test_a_cue_types_the_name_after_it(
    names: PiiRedactor, text: str, entity: str, value: str
) -> None:
    assert (entity, value) in [(e, text[s:t]) for e, s, t, _ in context_names(text)]
    start = text.index(value)
    placeholder = f"<{entity}_1>"
    assert names.redact(text).text == text[:start] + placeholder + text[start + len(value) :]


def test_a_bare_from_is_a_weaker_cue_than_spacy() -> None:
    text = "Demand from Dąbrowa Górnicza doubled."
    ((entity, start, end, score),) = context_names(text)
    assert (entity, text[start:end]) == ("LOCATION", "Dąbrowa Górnicza")
    assert score < 0.85 < CONTEXT_SCORE  # spaCy's score lies between the two


def test_in_or_near_outweighs_spacy_unless_a_possessive_follows() -> None:
    """A person seldom follows "in" or "near": the place reading beats spaCy's 0.85."""
    ((entity, _, _, score),) = context_names("Prices are higher in Dąbrowa Górnicza.")
    assert entity == "LOCATION" and score > 0.85
    ((_, _, _, score),) = context_names("It sits in Maria Rossi's backlog.")
    assert score < 0.85


@pytest.mark.parametrize(
    "text",
    [
        "The quarterly review moved to Thursday.",
        "Please ask Facilities about the parking permits.",  # a team, not a person
        "Forward the report to Accounts Payable.",
        "Deploy to Staging first, then ship to Production.",  # environments, not places
        "The budget is held in SAP under cost centre 4100.",  # an acronym
        "Customers asked for a refund.",
        "Please ask for the keys at the desk.",
        "the team moved to berlin last year.",  # lower case: no capitalised name
    ],
)
def test_no_cue_or_no_name_types_nothing(text: str) -> None:
    assert context_names(text) == []


def test_names_need_their_entities_in_the_policy(redactor: PiiRedactor) -> None:
    text = "I spoke with Tobiasz Kunc yesterday."
    assert redactor.redact(text).text == text


def test_structured_findings_win_over_a_name_spacy_sees_around_them(names: PiiRedactor) -> None:
    assert names.redact("ping 139.166.175.136").text == "ping <IP_ADDRESS_1>"
    assert names.redact("ping 1a04:f280:a86c:1fcf:f65e:e8fd:2a23:534a").text == (
        "ping <IP_ADDRESS_1>"
    )


def test_an_upper_case_iban_before_a_word_is_found(redactor: PiiRedactor) -> None:
    text = "Pay to ES8236236107668852611491 today."
    assert redactor.redact(text).text == "Pay to <IBAN_CODE_1> today."


def test_ten_bare_digits_are_a_phone_number_only_near_a_phone_word(redactor: PiiRedactor) -> None:
    assert redactor.redact("Phone: 3456539717").text == "Phone: <PHONE_NUMBER_1>"
    assert redactor.redact("Reach the desk on 3456539717.").text == (
        "Reach the desk on <PHONE_NUMBER_1>."
    )
    assert redactor.redact("Order 3456539717 shipped.").text == "Order 3456539717 shipped."
