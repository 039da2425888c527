"""Incremental detokenization: exact text, no half characters, stop strings cut."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from engine.detokenizer import IncrementalDetokenizer
from engine.tokenization import text_decoder

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
    tokenizer = smollm2[1]
    ids = tokenizer.convert_tokens_to_ids(['"', "unit", '"', "Ġ", ",", 'Ġ"', "x"])
    detok = IncrementalDetokenizer(text_decoder(tokenizer), ())
    text = "".join(detok.add(i) for i in ids) + detok.flush()
    assert text == '"unit" , "x'


# Texts whose tokens split characters (CJK, emoji, accents: several bytes, and byte-level
# BPE cuts them), with runs of spaces, code and a chat template's special tokens.
TRICKY_TEXTS = [
    "Ünïcödé café, naïve résumé — 日本語のテキスト 🎉🚀 and 👩‍👩‍👧 families.",
    "def f(x):\n    return x ** 2  # squares\n\n\tindented   spaces , commas",
    '{"name": "unit", "values": [1, 2.5, -3e4], "nested": {"ok": true}}',
    "<|im_start|>assistant\nHello!<|im_end|> after the end 123 456",
    "Grüße aus Köln. Привет, мир! مرحبا بالعالم. שלום עולם. ελληνικά.",
]


def incremental_text(decode: Any, ids: Sequence[int], stop: Sequence[str] = ()) -> str:
    detok = IncrementalDetokenizer(decode, stop)
    deltas = []
    for token in ids:
        deltas.append(detok.add(token))
        assert "\ufffd" not in deltas[-1]
        if detok.stopped:
            break
    return "".join(deltas) + detok.flush()


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_windowed_deltas_equal_decoding_the_whole_answer(
    smollm2: tuple[Any, Any], text: str
) -> None:
    """Each token decodes a short window; the deltas must still add up to what decoding
    every id at once gives, for byte-level BPE (SmolLM2's tokenizer)."""
    tokenizer = smollm2[1]
    decode = text_decoder(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert incremental_text(decode, ids) == decode(ids)
    # and a stop string that falls inside a later window is found there
    whole = decode(ids)
    stop = whole[len(whole) // 2 : len(whole) // 2 + 4]
    assert incremental_text(decode, ids, (stop,)) == whole[: whole.find(stop)]


@pytest.fixture(scope="module")
def sentencepiece_style() -> PreTrainedTokenizerFast:
    """A small Unigram tokenizer with SentencePiece's word-start marker (Metaspace), as
    Llama 2 and Mistral have: decoding drops the space before a window's first word."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"])
    tokenizer.train_from_iterator([t for t in TRICKY_TEXTS for _ in range(20)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_windowed_deltas_keep_sentencepiece_spaces(
    sentencepiece_style: PreTrainedTokenizerFast, text: str
) -> None:
    decode = text_decoder(sentencepiece_style)
    ids = sentencepiece_style.encode(text, add_special_tokens=False)
    assert " " in decode(ids)
    assert incremental_text(decode, ids) == decode(ids)


def test_the_fast_decoder_gives_transformers_text(smollm2: tuple[Any, Any]) -> None:
    """The Rust backend, called directly, returns what `tokenizer.decode` returns without
    clean-up; a tokenizer with no backend goes through `decode`."""
    tokenizer = smollm2[1]
    for text in TRICKY_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        expected = tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        assert text_decoder(tokenizer)(ids) == expected

    class SlowTokenizer:
        def decode(self, ids: list[int], **options: Any) -> str:
            assert options == {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}
            return "|".join(map(str, ids))

    assert text_decoder(SlowTokenizer())([1, 2]) == "1|2"
