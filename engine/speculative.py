"""Speculative decoding: prompt-lookup drafts, their verification, and how long to draft.

A RAG answer copies runs of tokens from the sources in its prompt. `NgramDrafter` finds the
longest recent suffix of prompt + answer that occurred earlier and proposes the tokens that
followed it; the runner verifies the draft in one step (one row per position, causal within
the draft), and `accept_draft` keeps the longest prefix that decoding would have produced,
plus one token of its own. Greedy output is token for token the same as without
speculation; sampled output keeps its distribution (rejection sampling against a point-mass
draft).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.sampling import apply_logit_bias, apply_penalties, probabilities, token_logprob
from engine.types import SamplingParams, TokenLogprob

# Suffix lengths tried, longest first: a longer match predicts the continuation better.
# One-token matches are not tried: on RAG answers (bench/speculative.py) 37% of their draft
# tokens were rejected against 25% without them, for no more tokens a second.
MAX_NGRAM = 4
MIN_NGRAM = 2
FIRST_DRAFT_TOKENS = 4
# A sequence whose drafts keep failing stops drafting for a while, longer each time.
_MISSES_BEFORE_PAUSE = 2
_FIRST_PAUSE_STEPS = 4
_LONGEST_PAUSE_STEPS = 64


class Drafter(Protocol):
    """Proposes draft tokens for one sequence and learns from how many were accepted."""

    def propose(self, token_ids: Sequence[int], limit: int) -> list[int]:
        """At most `limit` tokens that may follow `token_ids`; [] for no draft this step."""
        ...

    def record(self, drafted: int, accepted: int) -> None:
        """`accepted` of the `drafted` tokens proposed last were what decoding produces."""
        ...


@dataclass(slots=True)
class NgramDrafter:
    """One sequence's draft proposer and its adaptive draft length.

    The index maps each n-gram (n in MIN_NGRAM..MAX_NGRAM) to the position right after its
    latest occurrence; it grows with the sequence, each token indexed once.
    """

    max_tokens: int
    draft_tokens: int = FIRST_DRAFT_TOKENS
    _index: dict[tuple[int, ...], int] = field(default_factory=dict)
    _indexed: int = 0
    _misses: int = 0
    _pause: int = 0
    _paused_for: int = _FIRST_PAUSE_STEPS
    proposed: int = 0
    accepted: int = 0

    def __post_init__(self) -> None:
        self.draft_tokens = min(self.draft_tokens, self.max_tokens)

    def propose(self, token_ids: Sequence[int], limit: int) -> list[int]:
        """Up to `min(draft_tokens, limit)` tokens that may follow `token_ids`; [] if none."""
        if self._pause > 0:
            self._pause -= 1
            return []
        self._extend_index(token_ids)
        wanted = min(self.draft_tokens, limit)
        if wanted <= 0:
            return []
        length = len(token_ids)
        for n in range(min(MAX_NGRAM, length - 1), MIN_NGRAM - 1, -1):
            start = self._index.get(tuple(token_ids[length - n :]))
            if start is not None:
                return list(token_ids[start : start + wanted])
        return []

    def record(self, drafted: int, accepted: int) -> None:
        """Adapt to a verified draft: grow after a full match, shrink to what matched, and
        pause after repeated misses."""
        self.proposed += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.draft_tokens = min(self.max_tokens, self.draft_tokens + 2)
        else:
            self.draft_tokens = max(1, accepted + 1)
        if accepted > 0:
            self._misses = 0
            self._paused_for = _FIRST_PAUSE_STEPS
            return
        self._misses += 1
        if self._misses >= _MISSES_BEFORE_PAUSE:
            self._misses = 0
            self._pause = self._paused_for
            self._paused_for = min(2 * self._paused_for, _LONGEST_PAUSE_STEPS)

    def _extend_index(self, token_ids: Sequence[int]) -> None:
        # The n-gram ending at position i - 1 is followed by token i; the sequence's own
        # suffix (i == len) has no follower yet and is indexed once one arrives.
        index = self._index
        for i in range(max(self._indexed, MIN_NGRAM), len(token_ids)):
            for n in range(MIN_NGRAM, min(MAX_NGRAM, i) + 1):
                index[tuple(token_ids[i - n : i])] = i
        self._indexed = max(self._indexed, len(token_ids))


def accept_draft(
    logits: torch.Tensor,
    draft: Sequence[int],
    params: SamplingParams,
    output_ids: Sequence[int],
    generator: torch.Generator | None,
) -> list[tuple[int, TokenLogprob | None]]:
    """The tokens a verified draft yields: `logits` `[len(draft) + 1, vocab]` holds the
    next-token logits after the last token and after each draft token.

    Greedy keeps each draft token that is the argmax; sampling accepts draft token x with
    probability p(x) and otherwise samples from p without x, renormalised, which is exactly
    p overall. Either way the first mismatch ends the draft with the model's own token, and a
    fully accepted draft gains the token after it. Penalties count the accepted tokens
    before each position, as decoding one token at a time would.
    """
    plain = not params.has_penalties and not params.logit_bias and not params.logprobs
    if params.is_greedy and plain:
        choices = logits.argmax(dim=-1).tolist()
        tokens: list[tuple[int, TokenLogprob | None]] = []
        for position, choice in enumerate(choices):
            tokens.append((int(choice), None))
            if position == len(draft) or choice != draft[position]:
                break
        return tokens
    outputs = list(output_ids)
    result: list[tuple[int, TokenLogprob | None]] = []
    for position in range(len(draft) + 1):
        row = logits[position]
        if params.has_penalties:
            apply_penalties(row, outputs, params)
        apply_logit_bias(row, params)
        proposed = draft[position] if position < len(draft) else None
        token = _verify_position(row, proposed, params, generator)
        logprob = token_logprob(row, token, params.top_logprobs) if params.logprobs else None
        result.append((token, logprob))
        if token != proposed:
            break
        outputs.append(token)
    return result


def _verify_position(
    logits: torch.Tensor,
    proposed: int | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> int:
    """The token at one position: the draft's where it is accepted, else the model's own."""
    if params.is_greedy:
        return int(torch.argmax(logits).item())
    probs = probabilities(logits, params)
    if proposed is not None:
        accept = torch.rand((), dtype=torch.float64, generator=generator)
        if accept < probs[proposed]:
            return proposed
        probs = probs.clone()
        probs[proposed] = 0.0
        if probs.sum() <= 0:  # p(x) was 1 up to rounding: x is the only possible token
            return proposed
    return int(torch.multinomial(probs, 1, generator=generator).item())
