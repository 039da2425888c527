"""Chat prompts to token ids, and the token ids that end an answer, for a HF tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.types import ChatMessage


def encode_chat(tokenizer: Any, messages: Sequence[ChatMessage]) -> list[int]:
    """The model's chat template applied to `messages`, ready for the assistant's turn."""
    conversation = [{"role": m.role, "content": m.content} for m in messages]
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    return list(ids)


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
