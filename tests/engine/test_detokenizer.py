"""Incremental detokenization: exact text, no half characters, stop strings cut."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine import PagedEngine
from engine.detokenizer import IncrementalDetokenizer

PIECES = ["Hel", "lo", " wor", "ld", "!", " END", " more"]


def decode(ids: Sequence[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def test_deltas_add_up_to_the_full_text() -> None:
    detok = IncrementalDetokenizer(decode, ())
    out = "".join(detok.add(i) for i in range(len(PIECES))) + detok.flush()
    assert out == "".join(PIECES)


def test_stop_string_is_cut_and_never_emitted_in_part() -> None:
    detok = IncrementalDetokenizer(decode, (" END",))
    released = []
    for i in range(len(PIECES)):
        released.append(detok.add(i))
        if detok.stopped:
            break
    assert detok.stopped
    assert "".join(released) + detok.flush() == "Hello world!"


def test_possible_stop_prefix_is_held_back_then_released() -> None:
    detok = IncrementalDetokenizer(decode, ("ldX",))
    assert detok.add(0) + detok.add(1) + detok.add(2) == "Hello wor"
    assert detok.add(3) == ""  # "ld" could still become "ldX"
    assert detok.add(4) == "ld!"


def test_incomplete_utf8_is_held_back() -> None:
    pieces = ["caf", "\ufffd", "é"]

    def decode_bytes(ids: Sequence[int]) -> str:
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffdé", "é")

    detok = IncrementalDetokenizer(decode_bytes, ())
    assert detok.add(0) == "caf"
    assert detok.add(1) == ""
    assert detok.add(2) == "é"


def test_a_comma_after_a_space_survives_incremental_decoding(smollm2: tuple[Any, Any]) -> None:
    """HF's space clean-up turns ' ,' into ',' once the comma arrives, after the space
    was released: the engine decodes without it, so JSON like `"a" ,"b"` keeps its comma."""
    engine_decode = PagedEngine.from_hf_model(smollm2[0], smollm2[1], "m", "cpu")
    try:
        tokenizer = smollm2[1]
        ids = tokenizer.convert_tokens_to_ids(['"', "unit", '"', "Ġ", ",", 'Ġ"', "x"])
        detok = IncrementalDetokenizer(engine_decode._decode, ())
        text = "".join(detok.add(i) for i in ids) + detok.flush()
        assert text == '"unit" , "x'
    finally:
        engine_decode.close()
