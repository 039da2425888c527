"""Prompt encoding: the cached chat encoder and the token bound that skips counting."""

from __future__ import annotations

from typing import Any

import pytest

from engine import ChatMessage
from engine.tokenization import ChatEncoder, encode_chat, prompt_token_bound

TEXTS = (
    "How many vacation days do I get?",
    "Réunion jeudi à 14 h : numéros 0612345678, 1 2 3 4 5 6 7 8 9 0.",
    "数据中心的温度是多少\uff1f 🚀🚀🚀 ẞtraße naïve café",
    "    indented\n\n\tcode = [x ** 2 for x in range(10)]  # comment",
    "",
    "a" * 3000,
    "1" * 500 + " " + "!?" * 200,
)


@pytest.mark.parametrize("text", TEXTS)
def test_the_bound_is_never_below_the_count(smollm2: tuple[Any, Any], text: str) -> None:
    _, tokenizer = smollm2
    messages = [ChatMessage("system", "Answer briefly."), ChatMessage("user", text)]
    template = len(encode_chat(tokenizer, [ChatMessage(m.role, "") for m in messages]))
    assert len(encode_chat(tokenizer, messages)) <= prompt_token_bound(messages, template)


class _CountingTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.tokenizer.apply_chat_template(conversation, **kwargs)


def test_the_encoder_renders_each_prompt_once(smollm2: tuple[Any, Any]) -> None:
    _, tokenizer = smollm2
    counting = _CountingTokenizer(tokenizer)
    encoder = ChatEncoder(counting, entries=2)
    first = [ChatMessage("user", "one")]
    second = [ChatMessage("user", "two")]
    ids = encoder(first)
    assert ids == tuple(encode_chat(tokenizer, first))
    assert encoder(list(first)) == ids and counting.calls == 1
    encoder(second)
    encoder([ChatMessage("user", "three")])  # evicts `first`, the least recently used
    assert counting.calls == 3
    encoder(first)
    assert counting.calls == 4
