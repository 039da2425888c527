"""Continuous batching: which sequences run this step, and how many tokens each.

Every step spends a token budget: running decodes first (one token each, plus a
speculative draft's tokens where the batch is small enough, engine/speculative.py), then
prefill chunks of running sequences, then newly admitted ones, first come first served. A request
whose next prompt block is being computed by a running request waits for it and then reuses
it, instead of computing the same prefix again. When a decode needs a block and none is
left, the newest running sequence is preempted: its blocks are freed and it is recomputed
later (its computed blocks usually survive in the prefix cache).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sequence import Sequence, SequenceStatus

# The longest draft of a sequence that decodes beside others.
SHARED_DRAFT_TOKENS = 1


@dataclass(slots=True)
class ScheduledBatch:
    """The work of one step: (sequence, number of new tokens), in the order the budget
    served them, decodes first (the runner orders the rows itself); a decode with a draft
    (`Sequence.draft`) counts its last token and the draft's."""

    entries: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)


class Scheduler:
    """Owns the waiting queue and the running set; never holds a block it cannot account for."""

    def __init__(self, config: EngineConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence (done, stopped or cancelled) and free its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_batched_tokens
        decodes = [s for s in self.running if s.num_tokens - s.num_computed_tokens == 1]
        prefills = [s for s in self.running if s.num_tokens - s.num_computed_tokens > 1]
        drafting = len(self.running) <= self.config.speculative_max_batch
        # Beside another decode a draft adds its rows to both's: two one-token drafts are
        # 4 rows (about 1.5x the cost of 2), two three-token drafts 8 (about 3x), more than
        # their accepted tokens repay.
        draft_limit = budget if len(decodes) == 1 else SHARED_DRAFT_TOKENS
        for index, seq in enumerate(decodes):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if not self._make_room(seq, batch):
                continue
            self.blocks.append_slot(seq)
            if drafting and seq.drafter is not None:
                # Leave one token of the budget, and one block, to each decode after this one.
                limit = min(budget - (len(decodes) - index), draft_limit)
                self._draft(seq, limit, len(decodes) - index)
            batch.entries.append((seq, 1 + len(seq.draft)))
            budget -= 1 + len(seq.draft)
        for seq in prefills:
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            chunk = min(seq.num_tokens - seq.num_computed_tokens, budget)
            batch.entries.append((seq, chunk))
            budget -= chunk
        pending: set[bytes] | None = None
        while budget > 0 and self.waiting and len(self.running) < self.config.max_num_seqs:
            if batch.preempted:
                break  # memory is short: let running sequences finish first
            seq = self.waiting[0]
            cached = self.blocks.find_cached_prefix(seq)
            if pending is None:
                pending = self._blocks_being_prefilled()
            if len(cached) < len(seq.block_hashes) and seq.block_hashes[len(cached)] in pending:
                break  # its next block is being computed right now: wait and reuse it
            if not self.blocks.can_allocate(seq, cached):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq, cached)
            seq.status = SequenceStatus.RUNNING
            if seq.admitted_at is None:
                seq.admitted_at = time.monotonic()
            self.running.append(seq)
            pending.update(seq.block_hashes[len(cached) :])
            chunk = min(seq.num_tokens - seq.num_computed_tokens, budget)
            batch.entries.append((seq, chunk))
            budget -= chunk
        return batch

    def _draft(self, seq: Sequence, budget: int, spare_blocks: int) -> None:
        """Set `seq.draft`: a draft of at most `budget` tokens that fits the answer's
        remaining length, its grammar, and the KV blocks it can take without preempting."""
        assert seq.drafter is not None
        remaining = seq.params.max_tokens - seq.num_output_tokens - 1
        draft = seq.drafter.propose(seq.token_ids, min(budget, remaining))
        if draft and seq.grammar is not None:
            draft = seq.grammar.allowed_prefix(draft)
        if draft:
            held = self.blocks.reserve(seq, seq.num_tokens + len(draft), spare_blocks)
            draft = draft[: held - seq.num_tokens]
        seq.draft = draft

    def _blocks_being_prefilled(self) -> set[bytes]:
        """Hashes of full prompt blocks that running sequences have not computed yet."""
        size = self.blocks.block_size
        return {
            block_hash
            for seq in self.running
            for block_hash in seq.block_hashes[seq.num_computed_tokens // size :]
        }

    def _make_room(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        """Preempt the newest running sequences until `seq` can grow; False if `seq` went."""
        while not self.blocks.can_append(seq):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def after_step(self, batch: ScheduledBatch, computed: list[int] | None = None) -> None:
        """Advance computed-token counters and publish newly full blocks to the prefix cache.

        `computed[i]` is how many of entry i's tokens now have valid K/V (default: all of
        them); a draft's rejected tokens do not, and their blocks are given back."""
        for index, (seq, num_new) in enumerate(batch.entries):
            seq.num_computed_tokens += num_new if computed is None else computed[index]
            self.blocks.register_computed(seq)
            if seq.draft:
                seq.draft = []
                self.blocks.trim(seq)
