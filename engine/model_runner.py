"""Owns the KV pool and the fast path; turns a scheduled batch into logits and tokens.

The runner, not the model, picks the path of each step: its decodes go through the native
decode step (engine/native_decode.py) where it runs the model, everything else through
`PagedLlama.forward`.
"""

from __future__ import annotations

import torch

from engine.attention import AttentionContext, PrefillChunk
from engine.config import EngineConfig
from engine.kv_pool import KVPool
from engine.llama import PagedLlama
from engine.native_decode import NativeDecoder, native_decoder
from engine.sampling import sample_batch
from engine.scheduler import ScheduledBatch
from engine.types import TokenLogprob

# A step of fewer tokens than this (a few decodes) runs on one thread: its ops are too small
# to share, and on 2 cores a second thread made one stream's decoding erratic (38-57 tok/s
# against 52-53 on one thread) while it made 16 decodes 1.2-1.6x and prefill-heavy steps
# 1.4-1.9x faster (bench/engine.py).
SHARED_STEP_MIN_TOKENS = 8


class ModelRunner:
    """Runs the model for a step over its KV pool: builds token, position and slot tensors,
    sends the decodes to the native decoder where there is one, then samples."""

    def __init__(
        self,
        model: PagedLlama,
        pool: KVPool,
        threads: int | None = None,
        native: NativeDecoder | None = None,
    ) -> None:
        """`threads`: intra-op threads for steps of SHARED_STEP_MIN_TOKENS or more (smaller
        ones get one); None leaves the calling thread's setting alone. `native`: the
        decoder over `pool` that takes the steps' decodes (None: PyTorch does)."""
        self.model = model
        self.pool = pool
        self.native = native
        self.threads = threads
        self.block_size = pool.block_size
        self.device = model.device
        self._offsets = torch.arange(self.block_size, device=self.device)

    @classmethod
    def from_config(cls, model: PagedLlama, config: EngineConfig) -> ModelRunner:
        """A runner whose pool fills `config.kv_cache_mb` (or holds `num_kv_blocks`), with
        the native decode step where the config allows it and it runs the model."""
        pool = KVPool.for_config(model.kv_layout, config, model.device)
        native = native_decoder(model, pool, config.native_decode, config.native_cache_dir)
        return cls(model, pool, config.threads_for(model.device.type), native)

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """Slots of token positions `start:end` of a sequence."""
        first, last = start // self.block_size, -(-end // self.block_size)
        blocks = torch.tensor(block_table[first:last], device=self.device)
        slots = (blocks[:, None] * self.block_size + self._offsets).reshape(-1)
        skip = start - first * self.block_size
        return slots[skip : skip + end - start]

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[tuple[int, TokenLogprob | None] | None]:
        """Forward the batch; one sampled token per entry that reached its last token."""
        ids: list[int] = []
        positions: list[int] = []
        slot_parts: list[torch.Tensor] = []
        decode_tables: list[list[int]] = []
        decode_lengths: list[int] = []
        prefills: list[PrefillChunk] = []
        logit_rows: list[int] = []
        samplers: list[int] = []
        for index, (seq, n) in enumerate(batch.entries):
            start = seq.num_computed_tokens
            end = start + n
            row = len(ids)
            ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            if n == 1:
                decode_tables.append(seq.block_table)
                decode_lengths.append(end)
                slot = seq.block_table[start // self.block_size] * self.block_size
                slot_parts.append(torch.tensor([slot + start % self.block_size]))
            else:
                new_slots = self._slots(seq.block_table, start, end)
                slot_parts.append(new_slots)
                if start == 0:
                    prefills.append(PrefillChunk(row, n, None, None))
                else:
                    context = self._slots(seq.block_table, 0, end)
                    q_pos = torch.arange(start, end, device=self.device)
                    k_pos = torch.arange(end, device=self.device)
                    mask = k_pos[None, :] <= q_pos[:, None]
                    prefills.append(PrefillChunk(row, n, context, mask))
            if end == seq.num_tokens:
                logit_rows.append(row + n - 1)
                samplers.append(index)
        ctx = AttentionContext(
            slot_mapping=torch.cat(slot_parts).to(self.device),
            num_decodes=len(decode_tables),
            decode_slots=None,
            decode_mask=None,
            prefills=tuple(prefills),
        )
        if decode_tables:
            ctx = self._with_decodes(ctx, decode_tables, decode_lengths)
        self._set_threads(len(ids), native=bool(decode_tables) and self.native is not None)
        logits = self.run_model(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            ctx,
            torch.tensor(logit_rows, dtype=torch.long, device=self.device),
        )
        results: list[tuple[int, TokenLogprob | None] | None] = [None] * len(batch.entries)
        if samplers:
            seqs = [batch.entries[i][0] for i in samplers]
            sampled = sample_batch(
                logits.cpu(),
                [s.params for s in seqs],
                [s.output_ids for s in seqs],
                [s.generator for s in seqs],
            )
            for index, result in zip(samplers, sampled, strict=True):
                results[index] = result
        return results

    def run_model(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (float32) of the rows in `logit_rows`, after writing every token's K/V:
        the decodes through the native decoder where there is one, the rest through the
        model."""
        if self.native is None or ctx.decode_slots is None:
            return self.model.forward(input_ids, positions, ctx, self.pool, logit_rows)
        nd = ctx.num_decodes
        threads = torch.get_num_threads()
        decode_logits = self.native.step(input_ids[:nd], positions[:nd], ctx.decode_slots, threads)
        if not ctx.prefills:
            return decode_logits.index_select(0, logit_rows)
        from_decodes = logit_rows < nd
        logits = decode_logits.new_empty((logit_rows.shape[0], decode_logits.shape[1]))
        logits[from_decodes] = decode_logits.index_select(0, logit_rows[from_decodes])
        logits[~from_decodes] = self.model.forward(
            input_ids[nd:],
            positions[nd:],
            ctx.without_decodes(),
            self.pool,
            logit_rows[~from_decodes] - nd,
        )
        return logits

    def _set_threads(self, num_tokens: int, native: bool) -> None:
        """One thread for a small step, `threads` for a larger one or one with native
        decodes, whose one parallel region shares even a single row's weights well (this
        thread only)."""
        if self.threads is None:
            return
        wanted = self.threads if native or num_tokens >= SHARED_STEP_MIN_TOKENS else 1
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)

    def _with_decodes(
        self, ctx: AttentionContext, tables: list[list[int]], lengths: list[int]
    ) -> AttentionContext:
        width_blocks = max(len(t) for t in tables)
        padded = torch.tensor(
            [t + [0] * (width_blocks - len(t)) for t in tables], device=self.device
        )
        width = max(lengths)
        slots = (padded[:, :, None] * self.block_size + self._offsets).view(len(tables), -1)
        slots = slots[:, :width]
        mask = None
        if min(lengths) != width:
            lens = torch.tensor(lengths, device=self.device)
            mask = torch.arange(width, device=self.device)[None, :] < lens[:, None]
        return AttentionContext(
            ctx.slot_mapping, len(tables), slots.contiguous(), mask, ctx.prefills
        )
