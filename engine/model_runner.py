"""Owns the KV pool and the fast path; turns a scheduled batch into logits and tokens.

The runner, not the model, picks the path of each step: its decodes, drafts and short
prompt chunks go through the native decode step (engine/native_decode.py) where it runs the
model, longer chunks through `PagedLlama.forward`.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from engine.attention import AttentionContext, PrefillChunk, SharedPrefix
from engine.config import EngineConfig
from engine.grammar import GrammarRows, apply_masks, fill_masks
from engine.kv_pool import KVPool
from engine.llama import PagedLlama
from engine.native_decode import NativeDecoder, native_decoder
from engine.sampling import sample_batch
from engine.scheduler import ScheduledBatch
from engine.sequence import Sequence
from engine.speculative import accept_draft
from engine.types import TokenLogprob

# A step of fewer tokens than this (a few decodes) runs on one thread: its ops are too small
# to share, and on 2 cores a second thread made one stream's decoding erratic (38-57 tok/s
# against 52-53 on one thread) while it made 16 decodes 1.2-1.6x and prefill-heavy steps
# 1.4-1.9x faster (bench/engine.py).
SHARED_STEP_MIN_TOKENS = 8
# Sampling fewer rows than this runs on one thread: right after a native step the kernel's
# workers still spin on the other core, so a second OpenMP thread waited for them, and the
# elementwise ops over one row's 49,152 logits took a third of one stream's busy time.
SHARED_SAMPLING_MIN_ROWS = 16
# Prompt chunks of at most this many tokens go through the native decode step as rows
# (causal: each row attends up to its own position), beside the step's decodes, instead of
# a PyTorch pass of their own. Under load most prompts are prefix-cache hits but for the
# last block or two.
NATIVE_CHUNK_MAX_TOKENS = 32
# Prefill chunks that begin with at least this many tokens of the same cached blocks attend
# to them together (engine/attention.py, `SharedPrefix`). Chosen, not tuned: a run of a
# few blocks leaves little to read once, against the merge's extra ops.
CASCADE_MIN_TOKENS = 64


@dataclass
class StepInputs:
    """One step's tensors, and which batch entries sample a token (in logit-row order).

    `samplers` take one logit row each; then come `verifiers`, entries with a draft of k
    tokens, k + 1 rows each (engine/speculative.py)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    ctx: AttentionContext
    logit_rows: torch.Tensor
    samplers: list[int]
    verifiers: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _MaskStep:
    """The grammar masks of a step's constrained logit rows, being filled meanwhile."""

    bitmask: Future[torch.Tensor]
    constrained: list[GrammarRows]

    def apply(self, logits: torch.Tensor) -> None:
        rows = [row for rows in self.constrained for row in rows.rows]
        apply_masks(logits, self.bitmask.result(), rows)


@dataclass
class _StepParts:
    """What `prepare` gathers entry by entry before it makes the tensors."""

    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[torch.Tensor] = field(default_factory=list)
    decode_tables: list[list[int]] = field(default_factory=list)
    decode_lengths: list[int] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    # (index in `prefills`, block table, first new position) of chunks with cached context
    cached_chunks: list[tuple[int, list[int], int]] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)
    samplers: list[int] = field(default_factory=list)
    verify_rows: list[int] = field(default_factory=list)
    verifiers: list[int] = field(default_factory=list)


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
        # Grammar masks are filled here while the model runs.
        self._masks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")

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
    def run(self, batch: ScheduledBatch) -> list[list[tuple[int, TokenLogprob | None]] | None]:
        """Forward the batch; the sampled tokens of each entry that reached its last token:
        one, or for an entry with a draft the accepted draft tokens and one more."""
        step = self.prepare(batch)
        constrained = _grammar_rows(batch, step)
        masks = None
        if constrained:
            bitmask = self._masks.submit(fill_masks, len(step.logit_rows), constrained)
            masks = _MaskStep(bitmask, constrained)
        self._use_threads(self._step_threads(len(step.input_ids), step.ctx.num_decodes > 0))
        logits = self.run_model(step.input_ids, step.positions, step.ctx, step.logit_rows)
        if len(step.logit_rows) < SHARED_SAMPLING_MIN_ROWS:
            self._use_threads(1)
        return self._sample(batch, step, logits, masks)

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        """The step's tensors: each entry's tokens, positions and K/V slots, and the rows
        whose logits are sampled."""
        parts = _StepParts()
        # Rows through the native step come first: decodes, drafts, and short chunks.
        entries = sorted(
            enumerate(batch.entries), key=lambda entry: not self._native_rows(*entry[1])
        )
        for index, (seq, n) in entries:
            start = seq.num_computed_tokens
            end = start + n
            row = len(parts.ids)
            parts.positions.extend(range(start, end))
            if seq.draft:
                # The last token and its draft, one decode row each: every row stores its
                # K/V before any attends, so row j sees the draft's first j tokens.
                parts.ids.extend(seq.token_ids[start:])
                parts.ids.extend(seq.draft)
                self._add_decode_rows(parts, seq.block_table, start, end)
                parts.verify_rows.extend(range(row, row + n))
                parts.verifiers.append(index)
                continue
            parts.ids.extend(seq.token_ids[start:end])
            if self._native_rows(seq, n):
                self._add_decode_rows(parts, seq.block_table, start, end)
            else:
                self._add_prefill_chunk(parts, seq.block_table, start, end, row)
            if end == seq.num_tokens:
                parts.logit_rows.append(row + n - 1)
                parts.samplers.append(index)
        return self._tensors(parts)

    def _native_rows(self, seq: Sequence, n: int) -> bool:
        """Whether `seq`'s `n` tokens this step go through the decode path one row each: a
        decode or a draft always; a prompt chunk of at most NATIVE_CHUNK_MAX_TOKENS where
        the native step runs, since one more row there costs less than a PyTorch pass."""
        if n == 1 or seq.draft:
            return True
        return self.native is not None and n <= NATIVE_CHUNK_MAX_TOKENS

    def _add_decode_rows(
        self, parts: _StepParts, block_table: list[int], start: int, end: int
    ) -> None:
        """One native row for each of positions `start` .. `end - 1` of one sequence."""
        size = self.block_size
        parts.decode_tables.extend([block_table] * (end - start))
        parts.decode_lengths.extend(range(start + 1, end + 1))
        parts.slots.append(
            torch.tensor([block_table[p // size] * size + p % size for p in range(start, end)])
        )

    def _add_prefill_chunk(
        self, parts: _StepParts, block_table: list[int], start: int, end: int, row: int
    ) -> None:
        parts.slots.append(self._slots(block_table, start, end))
        if start == 0:
            parts.prefills.append(PrefillChunk(row, end, None, None))
            return
        context = self._slots(block_table, 0, end)
        q_pos = torch.arange(start, end, device=self.device)
        k_pos = torch.arange(end, device=self.device)
        mask = k_pos[None, :] <= q_pos[:, None]
        parts.cached_chunks.append((len(parts.prefills), block_table, start))
        parts.prefills.append(PrefillChunk(row, end - start, context, mask))

    def _shared_prefixes(self, parts: _StepParts) -> tuple[SharedPrefix, ...]:
        """The longest runs of whole cached blocks that chunks of the step begin with, for
        runs of at least CASCADE_MIN_TOKENS shared by two chunks or more (CPU only: the
        cascade uses PyTorch's CPU flash attention)."""
        if self.device.type != "cpu" or len(parts.cached_chunks) < 2:
            return ()
        by_first_block: dict[int, list[tuple[int, list[int], int]]] = {}
        for chunk in parts.cached_chunks:
            by_first_block.setdefault(chunk[1][0], []).append(chunk)
        shared_prefixes = []
        for members in by_first_block.values():
            if len(members) < 2:
                continue
            tables = [table for _, table, _ in members]
            limit = min(start for _, _, start in members) // self.block_size
            blocks = 0
            while blocks < limit and all(t[blocks] == tables[0][blocks] for t in tables):
                blocks += 1
            if blocks * self.block_size >= CASCADE_MIN_TOKENS:
                indexes = [index for index, _, _ in members]
                shared_prefixes.append(
                    SharedPrefix.of(
                        self._slots(tables[0], 0, blocks * self.block_size),
                        parts.prefills,
                        tuple(indexes),
                    )
                )
        return tuple(shared_prefixes)

    def _tensors(self, parts: _StepParts) -> StepInputs:
        ctx = AttentionContext(
            slot_mapping=torch.cat(parts.slots).to(self.device),
            num_decodes=len(parts.decode_tables),
            decode_slots=None,
            decode_mask=None,
            prefills=tuple(parts.prefills),
            shared_prefixes=self._shared_prefixes(parts),
        )
        if parts.decode_tables:
            ctx = self._with_decodes(ctx, parts.decode_tables, parts.decode_lengths)
        return StepInputs(
            input_ids=torch.tensor(parts.ids, dtype=torch.long, device=self.device),
            positions=torch.tensor(parts.positions, dtype=torch.long, device=self.device),
            ctx=ctx,
            logit_rows=torch.tensor(
                parts.logit_rows + parts.verify_rows, dtype=torch.long, device=self.device
            ),
            samplers=parts.samplers,
            verifiers=parts.verifiers,
        )

    @staticmethod
    def _sample(
        batch: ScheduledBatch,
        step: StepInputs,
        logits: torch.Tensor,
        masks: _MaskStep | None,
    ) -> list[list[tuple[int, TokenLogprob | None]] | None]:
        results: list[list[tuple[int, TokenLogprob | None]] | None] = [None] * len(batch.entries)
        logits = logits.cpu()
        if masks is not None:
            masks.apply(logits)
        samplers = step.samplers
        if samplers:
            seqs = [batch.entries[i][0] for i in samplers]
            sampled = sample_batch(
                logits[: len(samplers)],
                [s.params for s in seqs],
                [s.output_ids for s in seqs],
                [s.generator for s in seqs],
            )
            for index, result in zip(samplers, sampled, strict=True):
                results[index] = [result]
        row = len(samplers)
        for index in step.verifiers:
            seq, n = batch.entries[index]
            results[index] = accept_draft(
                logits[row : row + n], seq.draft, seq.params, seq.output_ids, seq.generator
            )
            row += n
        return results

    def run_model(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (float32) of the rows in `logit_rows`, after writing every token's K/V:
        the decode rows through the native decoder where there is one, the rest through the
        model."""
        if self.native is None or ctx.decode_slots is None:
            return self.model.forward(input_ids, positions, ctx, self.pool, logit_rows)
        nd = ctx.num_decodes
        threads = torch.get_num_threads()
        from_decodes = logit_rows < nd
        # The kernel takes the wanted rows in ascending order, each once.
        wanted, order = torch.unique(logit_rows[from_decodes], sorted=True, return_inverse=True)
        decode_logits = self.native.step(
            input_ids[:nd], positions[:nd], ctx.decode_slots, threads, wanted
        )
        if not ctx.prefills:
            if torch.equal(logit_rows, wanted):
                return decode_logits  # the rows in the kernel's order: no copy
            return decode_logits.index_select(0, order)
        logits = decode_logits.new_empty((logit_rows.shape[0], decode_logits.shape[1]))
        logits[from_decodes] = decode_logits.index_select(0, order)
        logits[~from_decodes] = self.model.forward(
            input_ids[nd:],
            positions[nd:],
            ctx.without_decodes(),
            self.pool,
            logit_rows[~from_decodes] - nd,
        )
        return logits

    def _step_threads(self, num_tokens: int, decodes: bool) -> int:
        """One thread for a small step, `threads` for a larger one or one with native
        decodes, whose one parallel region shares even a single row's weights well."""
        native = decodes and self.native is not None
        threads = self.threads or 1
        return threads if native or num_tokens >= SHARED_STEP_MIN_TOKENS else 1

    def _use_threads(self, wanted: int) -> None:
        """This thread's intra-op threads, unless the engine leaves them to PyTorch."""
        if self.threads is not None and torch.get_num_threads() != wanted:
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
            ctx.slot_mapping,
            len(tables),
            slots.contiguous(),
            mask,
            ctx.prefills,
            ctx.shared_prefixes,
        )


def _grammar_rows(batch: ScheduledBatch, step: StepInputs) -> list[GrammarRows]:
    """The logit rows of the step's constrained entries: a sampler's one row, a verifier's
    row for each draft token and the one after (each masked for the grammar's state after
    the draft tokens before it)."""
    constrained = [
        GrammarRows(row, grammar)
        for row, index in enumerate(step.samplers)
        if (grammar := batch.entries[index][0].grammar) is not None
    ]
    row = len(step.samplers)
    for index in step.verifiers:
        seq, n = batch.entries[index]
        if seq.grammar is not None:
            constrained.append(GrammarRows(row, seq.grammar, tuple(seq.draft)))
        row += n
    return constrained
