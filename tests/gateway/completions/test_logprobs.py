"""Logprobs go out with the text they spell, and never past a change the output checks made."""

from __future__ import annotations

from engine import TextLogprob
from gateway.completions.logprobs import LogprobGate, legacy_logprobs

HELLO = (TextLogprob(" Hel", -0.5, ((" Hel", -0.5), (" Hi", -1.5))), TextLogprob("lo", -0.1))
WORLD = (TextLogprob(" wor", -0.2), TextLogprob("ld", -0.3))


def test_the_legacy_shape_counts_offsets_from_the_first_token() -> None:
    body = legacy_logprobs(list(HELLO), 4)
    assert body == {
        "tokens": [" Hel", "lo"],
        "token_logprobs": [-0.5, -0.1],
        "top_logprobs": [{" Hel": -0.5, " Hi": -1.5}, {}],
        "text_offset": [4, 8],
    }


def test_two_alternatives_that_read_alike_keep_the_likelier() -> None:
    entry = TextLogprob("\ufffd", -1.0, (("\ufffd", -1.0), ("\ufffd", -0.7), ("a", -3.0)))
    assert legacy_logprobs([entry], 0)["top_logprobs"] == [{"\ufffd": -0.7, "a": -3.0}]


def test_entries_wait_for_the_text_they_spell() -> None:
    gate = LogprobGate()
    gate.add(" Hello", HELLO)
    assert gate.release(" Hel") == ([HELLO[0]], 0)
    gate.add(" world", WORLD)
    assert gate.release("lo wo") == ([HELLO[1]], 4)
    assert gate.release("rld", final=True) == (list(WORLD), 6)
    assert not gate.withheld


def test_a_redaction_withholds_every_later_entry() -> None:
    gate = LogprobGate()
    gate.add(" Hello", HELLO)
    assert gate.release(" Hel") == ([HELLO[0]], 0)
    gate.add(" world", WORLD)
    assert gate.release("lo <NAME>", final=True) == ([], 4)
    assert gate.withheld
    gate.add("!", (TextLogprob("!", -0.1),))
    assert gate.release("!", final=True)[0] == []


def test_a_whole_answer_changed_at_its_end_gets_none() -> None:
    gate = LogprobGate()
    gate.add(" Hello world", HELLO + WORLD)
    assert gate.release(" Hello <NAME>", final=True) == ([], 0)
    assert gate.withheld
