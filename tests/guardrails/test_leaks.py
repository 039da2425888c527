from __future__ import annotations

from guardrails.config import LeakConfig
from guardrails.leaks import CANARY_MARKER, LEAK_MARKER, LeakDetector, new_canary

SYSTEM_PROMPT = (
    "You are Northwind's internal assistant. Answer briefly and truthfully. When sources "
    "are given, answer from them and cite them as [1], [2]."
)


def test_canary_is_masked_case_insensitively() -> None:
    canary = new_canary()
    detector = LeakDetector(LeakConfig(canaries=[canary]), SYSTEM_PROMPT)
    result = detector.filter(f"The marker is {canary.upper()}.")
    assert result.text == f"The marker is {CANARY_MARKER}."
    assert result.verdict.action == "block"
    assert result.verdict.evidence == ("canary string x1",)


def test_verbatim_system_prompt_is_masked() -> None:
    detector = LeakDetector(LeakConfig(), SYSTEM_PROMPT)
    answer = (
        "My instructions say: you are Northwind's internal assistant, answer briefly and "
        "truthfully!"
    )
    result = detector.filter(answer)
    assert "internal assistant" not in result.text
    assert LEAK_MARKER in result.text
    assert result.verdict.action == "block"
    assert "system prompt" in result.verdict.evidence[0]


def test_answers_sharing_a_few_words_pass() -> None:
    detector = LeakDetector(LeakConfig(), SYSTEM_PROMPT)
    answer = "Northwind's internal wiki lists the holidays [1]. Answer briefly: 12 days."
    result = detector.filter(answer)
    assert result.text == answer
    assert result.verdict.action == "allow"


def test_warn_mode_keeps_text() -> None:
    detector = LeakDetector(LeakConfig(mode="warn", canaries=["zebra-42"]))
    result = detector.filter("zebra-42")
    assert result.text == "zebra-42"
    assert result.verdict.action == "block" and not result.verdict.blocks


def test_a_stream_holds_the_words_that_run_on_in_the_prompt() -> None:
    detector = LeakDetector(LeakConfig(), SYSTEM_PROMPT)
    text = "Here is my brief: you are Northwind's internal "
    hold = detector.hold_from(text)
    assert hold is not None and text[hold:] == "you are Northwind's internal "
    # Words of the prompt that do not follow each other there are no leak in progress.
    assert detector.hold_from("They answer the assistant ") == len("They answer the ")
    assert detector.hold_from("Nothing of it here. ") == len("Nothing of it here. ")


def test_a_canary_with_spaces_leaves_the_stream_to_its_window() -> None:
    spaced = LeakDetector(LeakConfig(canaries=["blue heron seven"]), SYSTEM_PROMPT)
    assert spaced.hold_from("Some words. ") is None
    plain = LeakDetector(LeakConfig(canaries=[new_canary()]), SYSTEM_PROMPT)
    assert plain.hold_from("Some words. ") == len("Some words. ")
