"""Turning next-token logits into a token id."""

from __future__ import annotations

import torch

from engine.types import SamplingParams


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """Greedy when temperature is 0, else temperature plus nucleus (top-p) sampling."""
    if params.temperature == 0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, sorted_ids = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        outside = cumulative - sorted_probs >= params.top_p
        sorted_probs[outside] = 0.0
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(sorted_ids[choice].item())
    return int(torch.multinomial(probs, 1, generator=generator).item())
