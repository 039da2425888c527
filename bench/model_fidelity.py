"""What a weight format costs in quality, through the engine's own model code.

Three measures: perplexity of a fixed text (teacher-forced) in one prefill and through
decode steps, one token at a time (where int8 weights take the native decode step), and
greedy answers to short questions, decoded step by step, compared with float32's. All run
the forward passes the engine serves with, so they cover the projections, bf16
activations and attention.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.llama import PagedLlama
from engine.standalone import StandaloneSequence, standalone_prefill_logits
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


def decode_perplexity(model: PagedLlama, ids: list[int]) -> float:
    """Perplexity of `ids`, each token after the first predicted by one decode step."""
    session = StandaloneSequence(model, len(ids))
    rows = [session.prefill(ids[:1])[0]] + [session.decode(t)[0] for t in ids[1:-1]]
    return math.exp(F.cross_entropy(torch.stack(rows), torch.tensor(ids[1:])).item())


def greedy_answers(model: PagedLlama, tokenizer: Any, new_tokens: int = 10) -> list[list[int]]:
    """The first `new_tokens` greedy tokens of the answer to each of `QUESTIONS`, decoded
    step by step."""
    answers = []
    for question in QUESTIONS:
        ids = encode_chat(tokenizer, [ChatMessage("user", question)])
        session = StandaloneSequence(model, len(ids) + new_tokens)
        answer = [int(session.prefill(ids).argmax())]
        while len(answer) < new_tokens:
            answer.append(int(session.decode(answer[-1]).argmax()))
        answers.append(answer)
    return answers


@torch.inference_mode()
def hf_perplexity(hf: Any, ids: list[int]) -> float:
    tokens = torch.tensor([ids])
    logits = hf(input_ids=tokens).logits[0, :-1].float()
    return math.exp(F.cross_entropy(logits, tokens[0, 1:]).item())
