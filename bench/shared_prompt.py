"""The prompts of the shared-system-message scenario (issue 19), for bench/gateway.py and
bench/stages.py: distinct questions over the sample corpus, and the client's own ~800-token
system message that they share."""

from __future__ import annotations

from load import QUESTIONS

from guardrails.train_injection import SHARED_DATA
from retrieval import smart_format


def questions(count: int) -> list[str]:
    """`count` distinct questions over the sample corpus (no two share a whole prompt)."""
    return [f"{QUESTIONS[i % len(QUESTIONS)]} (ticket {1000 + i})" for i in range(count)]


def shared_system_message(tokens: int = 800) -> str:
    """About 800 tokens of engineering notes (Cranfield abstracts): the client's own
    system message that 15 concurrent requests share."""
    abstracts = smart_format.texts(SHARED_DATA / "retrieval" / "cranfield" / "cran.all.1400", 80)
    words = " ".join(abstracts[:20]).split()
    # SmolLM2's tokenizer gives about 1.3 tokens a word on this prose.
    return "Use these engineering notes when you answer.\n" + " ".join(words[: int(tokens / 1.3)])
