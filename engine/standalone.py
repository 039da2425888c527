"""One sequence through a model outside the engine, in a KV pool of its own.

For measuring a model (bench/model_fidelity.py) and for tests: no scheduler and no block
table, slot i holds position i. Steps go through a `ModelRunner`, so they take the paths
the engine's steps take (decodes native where the runner would send them there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.attention import AttentionContext, PrefillChunk
from engine.kv_pool import KVPool
from engine.llama import PagedLlama
from engine.model_runner import ModelRunner
from engine.native_decode import native_decoder


class StandaloneSequence:
    """A sequence of up to `capacity` tokens: one prefill, then one decode step per token.

    `native`: decode steps through the native decode step where it runs the model.
    """

    def __init__(self, model: PagedLlama, capacity: int, native: bool = True) -> None:
        pool = KVPool.allocate(model.kv_layout, 1, capacity, model.device)
        self.runner = ModelRunner(model, pool, native=native_decoder(model, pool, native))
        self.length = 0

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of `rows` of `ids` (None: the last one), the sequence's first tokens."""
        n = len(ids)
        ctx = AttentionContext(torch.arange(n), 0, None, None, (PrefillChunk(0, n, None, None),))
        self.length = n
        logit_rows = torch.tensor([n - 1]) if rows is None else rows
        return self.runner.run_model(torch.tensor(list(ids)), torch.arange(n), ctx, logit_rows)

    @torch.inference_mode()
    def decode(self, token: int) -> torch.Tensor:
        """Logits `[1, vocab]` after appending `token`, as the engine's decode steps compute
        them."""
        position = self.length
        slots = torch.arange(position + 1)[None, :]
        ctx = AttentionContext(torch.tensor([position]), 1, slots, None, ())
        self.length += 1
        return self.runner.run_model(
            torch.tensor([token]), torch.tensor([position]), ctx, torch.tensor([0])
        )


def standalone_prefill_logits(
    model: PagedLlama, ids: Sequence[int], rows: torch.Tensor
) -> torch.Tensor:
    """Logits of `rows` after one prefill of `ids` into a throwaway KV pool."""
    return StandaloneSequence(model, len(ids), native=False).prefill(ids, rows)
