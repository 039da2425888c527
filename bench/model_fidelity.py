"""What a weight format costs in quality, through the engine's own model code.

Two measures: perplexity of a fixed text (teacher-forced, every row's logits), and greedy
answers to short questions compared with float32's. Both run the forward pass the engine
serves with, so they cover the projections, bf16 activations and attention.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.llama import PagedLlama, standalone_prefill_logits
from engine.tokenization import encode_chat
from engine.types import ChatMessage

DOCS = Path(__file__).resolve().parents[1] / "docs"


def corpus_ids(tokenizer: Any, max_tokens: int) -> list[int]:
    """The sample corpus, then the architecture notes, as token ids cut to `max_tokens`."""
    files = [*sorted((DOCS / "sample-corpus").glob("*.md")), DOCS / "architecture.md"]
    text = "\n\n".join(p.read_text() for p in files)
    ids: list[int] = tokenizer(text).input_ids
    return ids[:max_tokens]


QUESTIONS = (
    "What is the capital of France?",
    "What is the capital of Germany?",
    "How many days are in a week?",
    "Who wrote Romeo and Juliet?",
    "What colour is the sky on a clear day?",
    "Translate 'thank you' into Spanish.",
    "What is 12 times 12?",
    "Name the largest planet in the solar system.",
)


@torch.inference_mode()
def engine_perplexity(model: PagedLlama, ids: list[int]) -> float:
    logits = standalone_prefill_logits(model, ids, torch.arange(len(ids) - 1))
    return math.exp(F.cross_entropy(logits, torch.tensor(ids[1:])).item())


@torch.inference_mode()
def greedy_answers(model: PagedLlama, tokenizer: Any, new_tokens: int = 10) -> list[list[int]]:
    """The first `new_tokens` greedy tokens of the answer to each of `QUESTIONS`."""
    answers = []
    for question in QUESTIONS:
        ids = encode_chat(tokenizer, [ChatMessage("user", question)])
        prompt_length = len(ids)
        for _ in range(new_tokens):
            ids.append(
                int(standalone_prefill_logits(model, ids, torch.tensor([len(ids) - 1]))[0].argmax())
            )
        answers.append(ids[prompt_length:])
    return answers


@torch.inference_mode()
def hf_perplexity(hf: Any, ids: list[int]) -> float:
    tokens = torch.tensor([ids])
    logits = hf(input_ids=tokens).logits[0, :-1].float()
    return math.exp(F.cross_entropy(logits, tokens[0, 1:]).item())
