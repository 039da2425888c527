"""Owns the KV pool and turns a scheduled batch into one forward pass and sampled tokens."""

from __future__ import annotations

import torch

from engine.attention import AttentionContext, PrefillChunk
from engine.config import EngineConfig
from engine.llama import ModelShape, PagedLlama
from engine.sampling import sample_batch
from engine.scheduler import ScheduledBatch
from engine.types import EngineError, TokenLogprob

# A step of fewer tokens than this (a few decodes) runs on one thread: its ops are too small
# to share, and on 2 cores a second thread made one stream's decoding erratic (38-57 tok/s
# against 52-53 on one thread) while it made 16 decodes 1.2-1.6x and prefill-heavy steps
# 1.4-1.9x faster (bench/engine.py).
SHARED_STEP_MIN_TOKENS = 8


def kv_bytes_per_block(shape: ModelShape, block_size: int, dtype: torch.dtype) -> int:
    element = torch.tensor([], dtype=dtype).element_size()
    return 2 * shape.num_layers * block_size * shape.num_kv_heads * shape.head_dim * element


class ModelRunner:
    """Runs the model for a step: builds token, position and slot tensors, then samples."""

    def __init__(
        self,
        model: PagedLlama,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        threads: int | None = None,
    ) -> None:
        """`threads`: intra-op threads for steps of SHARED_STEP_MIN_TOKENS or more (smaller
        ones get one); None leaves the calling thread's setting alone."""
        self.model = model
        self.threads = threads
        self.block_size = block_size
        self.device = device
        shape = model.shape
        slots = num_blocks * block_size
        dims = (shape.num_kv_heads, slots, shape.head_dim)  # head-major (engine/attention.py)
        self.kv_cache = [
            (
                torch.zeros(dims, dtype=model.dtype, device=device),
                torch.zeros(dims, dtype=model.dtype, device=device),
            )
            for _ in range(shape.num_layers)
        ]
        self._offsets = torch.arange(block_size, device=device)

    @classmethod
    def from_config(
        cls, model: PagedLlama, config: EngineConfig, device: torch.device
    ) -> ModelRunner:
        """A runner whose pool fills `config.kv_cache_mb` (or holds `num_kv_blocks`)."""
        block_size, kv_cache_mb = config.block_size, config.kv_cache_mb
        per_block = kv_bytes_per_block(model.shape, block_size, model.dtype)
        num_blocks = config.num_kv_blocks or kv_cache_mb * 1024 * 1024 // per_block
        if num_blocks < 2:
            raise EngineError(
                f"a KV cache of {kv_cache_mb} MiB holds fewer than 2 blocks of {block_size} "
                f"tokens ({per_block} bytes each): raise BASTION_KV_CACHE_MB"
            )
        return cls(model, num_blocks, block_size, device, config.threads_for(device.type))

    @property
    def num_blocks(self) -> int:
        return self.kv_cache[0][0].shape[1] // self.block_size

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
        native = bool(decode_tables) and self.model.native_decoder(self.kv_cache) is not None
        self._set_threads(len(ids), native)
        logits = self.model.forward(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            ctx,
            self.kv_cache,
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
