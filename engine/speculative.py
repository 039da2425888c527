"""Speculative decoding: what a drafter promises, and which of a verified draft's tokens stay.

A drafter (engine/spec_drafts.py `SuffixDrafter`) proposes the tokens that followed the
longest earlier match of the sequence's suffix; the runner verifies the draft in one step
(one row per position, causal within the draft), and `accept_draft` keeps the longest
prefix that decoding would have produced, plus one token of its own. Greedy output is
token for token the same as without speculation; sampled output keeps its distribution
(rejection sampling against a point-mass draft).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engine.sampling import apply_logit_bias, apply_penalties, draw, probabilities, token_logprob
from engine.types import SamplingParams, TokenLogprob


class Drafter(Protocol):
    """Proposes draft tokens for one sequence and learns from how many were accepted."""

    def propose(self, token_ids: Sequence[int], limit: int) -> list[int]:
        """At most `limit` tokens that may follow `token_ids`; [] for no draft this step."""
        ...

    def record(self, drafted: int, accepted: int) -> None:
        """`accepted` of the `drafted` tokens proposed last were what decoding produces."""
        ...


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
    return draw(probs, generator)  # p without x needs no renormalising: draw scales by the mass
