"""Synthetic requests the engine benchmarks share."""

from __future__ import annotations

import torch


def prompt_ids(length: int, seed: int) -> list[int]:
    """`length` token ids drawn from the vocabulary's ordinary range, the same for a seed."""
    generator = torch.Generator().manual_seed(seed)
    return list(torch.randint(100, 40000, (length,), generator=generator).tolist())
