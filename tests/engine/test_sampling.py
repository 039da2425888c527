"""Token choice: greedy is argmax; seeded sampling repeats; top-p excludes the tail."""

from __future__ import annotations

import torch

from engine.sampling import sample_next_token
from engine.types import SamplingParams


def test_greedy_picks_the_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample_next_token(logits, SamplingParams(temperature=0), None) == 1


def test_same_seed_same_choices() -> None:
    logits = torch.zeros(50)
    params = SamplingParams(temperature=1.0)
    first = [sample_next_token(logits, params, torch.Generator().manual_seed(7)) for _ in range(5)]
    second = [sample_next_token(logits, params, torch.Generator().manual_seed(7)) for _ in range(5)]
    assert first == second


def test_top_p_never_picks_outside_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05]))
    params = SamplingParams(temperature=1.0, top_p=0.8)
    generator = torch.Generator().manual_seed(0)
    picks = {sample_next_token(logits, params, generator) for _ in range(300)}
    assert picks == {0, 1}
