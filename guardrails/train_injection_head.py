"""Fit the injection classifier's token head (`guardrails/injection_head.py`) on top of
its linear model, on the CPU; `guardrails/train_injection.py` calls `fit_head` once per
cross-validation fold and once on the whole training split.

Stacked: the logistic regression over the n-grams and the sentence vector is fitted
first, and the head learns what it gets wrong. The head is trained on the regression's
out-of-fold logits of the same rows (an inner 5-fold cross-validation), which are as
unsure as its logits of new text; the rows' own logits, fitted on them, would leave the
head little to learn. The full model's logit is then `scale * linear + bias + head`, and
the shipped weights fold `scale` and `bias` into the linear part.

Chosen by out-of-fold recall on the training split (17,572 rows), at the threshold rule
of `train_injection.py` with 2% allowed per goal source and the hard negatives weighing
as one other source: the regression alone 0.805; a joint fit of both parts in PyTorch
(Adam) 0.791, its linear part under-fitted (0.706 without the head); stacked, 64 hidden
units and 12 epochs 0.820, 128 and 16 epochs 0.829.

Seeded: the same data gives the same weights on the same machine (float sums may differ
in the last bits across thread counts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as f
from torch import nn

from guardrails.injection_head import TokenHead

HIDDEN = 128
EPOCHS = 16
BATCH = 128
LEARNING_RATE = 3e-3
HEAD_DECAY = 1e-4
SEED = 0


@dataclass(frozen=True, slots=True)
class StackedHead:
    """logit = scale * (the linear model's logit) + bias + head(token vectors)."""

    scale: float
    bias: float
    head: TokenHead

    def logits(
        self, linear: npt.NDArray[np.float64], tokens: Sequence[npt.NDArray[np.float32]]
    ) -> npt.NDArray[np.float64]:
        return self.scale * linear + self.bias + self.head.logits(tokens)


def fit_head(
    linear: npt.NDArray[np.float64],
    tokens: Sequence[npt.NDArray[np.float32]],
    labels: npt.NDArray[np.int_],
    weights: npt.NDArray[np.float64],
) -> StackedHead:
    """Adam over mini-batches of texts of similar token counts, cosine-decayed learning
    rate, EPOCHS passes; `linear` holds the linear model's out-of-fold logits."""
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    model = _Head(tokens[0].shape[1], HIDDEN)
    optimiser = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    by_length = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
    batches = [by_length[i : i + BATCH] for i in range(0, len(by_length), BATCH)]
    decayed = [model.proj.weight, model.att.weight, model.out.weight]
    steps = EPOCHS * len(batches)
    for step in range(steps):
        if step % len(batches) == 0:
            rng.shuffle(batches)
        rows = batches[step % len(batches)]
        for group in optimiser.param_groups:
            group["lr"] = LEARNING_RATE * 0.5 * (1 + math.cos(math.pi * step / steps))
        token_batch, mask = _padded([tokens[i] for i in rows])
        logits = model(torch.from_numpy(linear[rows].astype(np.float32)), token_batch, mask)
        target = torch.from_numpy(labels[rows].astype(np.float32))
        loss = f.binary_cross_entropy_with_logits(logits, target, reduction="none")
        loss = (loss * torch.from_numpy(weights[rows].astype(np.float32))).mean()
        loss = loss + HEAD_DECAY * sum(p.square().sum() for p in decayed)
        optimiser.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimiser.step()
    return model.exported()


def _padded(tokens: Sequence[npt.NDArray[np.float32]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's token vectors, zero-padded to its longest text, and the mask of real ones."""
    longest = max(1, max(len(t) for t in tokens))
    batch = np.zeros((len(tokens), longest, tokens[0].shape[1]), dtype=np.float32)
    mask = np.zeros((len(tokens), longest), dtype=bool)
    for i, rows in enumerate(tokens):
        batch[i, : len(rows)] = rows
        mask[i, : len(rows)] = True
    return torch.from_numpy(batch), torch.from_numpy(mask)


class _Head(nn.Module):
    """The stacked head in PyTorch (`TokenHead` is its numpy twin)."""

    def __init__(self, dimension: int, hidden: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.proj = nn.Linear(dimension, hidden)
        # No bias: a constant added to every token's score leaves the softmax unchanged.
        self.att = nn.Linear(hidden, 1, bias=False)
        self.out = nn.Linear(2 * hidden, 1)  # its bias is the stack's bias
        nn.init.zeros_(self.out.weight)  # starts as the linear model alone

    def forward(
        self, linear: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        h = f.gelu(self.proj(tokens), approximate="tanh")
        scores = self.att(h).squeeze(-1).masked_fill(~mask, -1e9)
        attended = (torch.softmax(scores, dim=1)[..., None] * h).sum(dim=1)
        strongest = h.masked_fill(~mask[..., None], -1e9).max(dim=1).values
        head: torch.Tensor = self.out(torch.cat([attended, strongest], dim=1)).squeeze(1)
        return self.scale * linear + head

    def exported(self) -> StackedHead:
        return StackedHead(
            float(self.scale.item()),
            float(self.out.bias.item()),
            TokenHead(
                np.ascontiguousarray(_array(self.proj.weight).T),
                _array(self.proj.bias),
                _array(self.att.weight)[0],
                _array(self.out.weight)[0],
                0.0,  # the bias goes to the linear part's intercept
            ),
        )


def _array(t: torch.Tensor) -> npt.NDArray[np.float32]:
    return np.asarray(t.detach().numpy(), dtype=np.float32)
