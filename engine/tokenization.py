"""Chat prompts to token ids, and the token ids that end an answer, for a HF tokenizer."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from engine.types import ChatMessage


def encode_chat(tokenizer: Any, messages: Sequence[ChatMessage]) -> list[int]:
    """The model's chat template applied to `messages`, ready for the assistant's turn."""
    conversation = [{"role": m.role, "content": m.content} for m in messages]
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    return list(ids)


class ChatEncoder:
    """`encode_chat` with the last few prompts' ids kept.

    The gateway counts a prompt's tokens to check it fits the context window, then the
    engine encodes the same messages to run them: rendering the template and tokenizing a
    prompt with its sources cost about 4 ms on the event loop each time.
    """

    def __init__(self, tokenizer: Any, entries: int = 64) -> None:
        self._tokenizer = tokenizer
        self._entries = entries
        self._ids: OrderedDict[tuple[ChatMessage, ...], tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()  # called from the event loop and from worker threads

    def __call__(self, messages: Sequence[ChatMessage]) -> tuple[int, ...]:
        key = tuple(messages)
        with self._lock:
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
                return ids
        ids = tuple(encode_chat(self._tokenizer, key))
        with self._lock:
            self._ids[key] = ids
            while len(self._ids) > self._entries:
                self._ids.popitem(last=False)
        return ids


def text_decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    """Token ids to text, special tokens left out and spaces as the tokens have them.

    No clean-up of spaces: it rewrites " ," to "," once the comma arrives, after the space
    went out, so incremental text would lose the comma. A fast tokenizer's Rust backend is
    called directly: transformers' `decode` around it gives the same text at about twice
    the cost (a list and type checks in Python per call), and streaming decodes per token.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:

        def decode_backend(ids: Sequence[int]) -> str:
            return str(backend.decode(list(ids), skip_special_tokens=True))

        return decode_backend

    def decode(ids: Sequence[int]) -> str:
        return str(
            tokenizer.decode(
                list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        )

    return decode


def prompt_token_bound(messages: Sequence[ChatMessage], template_tokens: int) -> int:
    """At least as many tokens as `messages` encode to, without tokenizing them.

    A token of a byte-level BPE vocabulary covers at least one byte of the text, and one of
    a SentencePiece vocabulary at least one character, but for the word-start piece put
    before a message's first word. `template_tokens` is the count of the same roles with
    empty contents: the template's own tokens, a default system prompt included.
    """
    return template_tokens + sum(len(m.content.encode("utf-8")) + 1 for m in messages)


def find_stop_token_ids(tokenizer: Any, generation_config: Any) -> frozenset[int]:
    """The generation config's EOS ids plus `<|im_end|>` where the vocabulary has it."""
    ids: set[int] = set()
    eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list):
        ids.update(eos)
    if tokenizer is not None:
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
            ids.add(im_end)
    return frozenset(ids)
