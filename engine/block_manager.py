"""The KV block pool's bookkeeping: allocation, ref counts and the automatic prefix cache.

A full block whose K/V has been computed is registered under a chained hash of
(parent block's hash, its token ids, extra keys). The extra keys hold the tenant's cache
salt and the model id, so two tenants never resolve to the same block. A block nobody
references keeps its hash and stays findable until it is evicted, least recently freed
first, when a fresh block is needed.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass

from engine.sequence import Sequence
from engine.types import EngineError


class BlockAccountingError(EngineError):
    """The block pool's invariants were broken: a bug, never a user error."""


@dataclass(frozen=True, slots=True)
class BlockCounts:
    """A snapshot of the pool: used (referenced), cached (free but findable), free."""

    total: int
    used: int
    cached: int
    free: int


def hash_block(parent: bytes, token_ids: list[int], extra: bytes) -> bytes:
    """The chained, collision-resistant key of one full block of tokens."""
    digest = hashlib.sha256(parent)
    digest.update(array("q", token_ids).tobytes())
    digest.update(extra)
    return digest.digest()


class BlockManager:
    """Hands out block ids to sequences and shares computed blocks through their hashes."""

    def __init__(
        self, num_blocks: int, block_size: int, model_id: str, enable_prefix_caching: bool = True
    ) -> None:
        if num_blocks <= 0:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._model_key = model_id.encode()
        self._ref_counts = [0] * num_blocks
        self._block_hash: list[bytes | None] = [None] * num_blocks
        self._hash_to_block: dict[bytes, int] = {}
        self._free: deque[int] = deque(range(num_blocks))
        # Free blocks that still hold a registered prefix, oldest-freed first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of those, tokens found in the cache

    # -- queries --------------------------------------------------------------------------

    @property
    def num_available(self) -> int:
        """Blocks that can be handed out now, evicting cached ones if need be."""
        return len(self._free) + len(self._evictable)

    def counts(self) -> BlockCounts:
        cached = len(self._evictable)
        free = len(self._free)
        return BlockCounts(self.num_blocks, self.num_blocks - cached - free, cached, free)

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    # -- allocation -----------------------------------------------------------------------

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold a prefix of `seq`, never covering its last token.

        The last token must go through the model to produce the next token's logits.
        """
        if not self.enable_prefix_caching:
            return []
        self._extend_hashes(seq, (seq.num_tokens - 1) // self.block_size)
        found: list[int] = []
        for block_hash in seq.block_hashes[: (seq.num_tokens - 1) // self.block_size]:
            block_id = self._hash_to_block.get(block_hash)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def can_allocate(self, seq: Sequence, cached: list[int]) -> bool:
        """Whether all of `seq`'s tokens fit, reusing `cached` (from find_cached_prefix)."""
        reusable_free = sum(1 for b in cached if self._ref_counts[b] == 0)
        fresh = self.blocks_needed(seq.num_tokens) - len(cached)
        return fresh <= self.num_available - reusable_free

    def allocate(self, seq: Sequence, cached: list[int]) -> None:
        """Give `seq` blocks for all its tokens: the cached prefix first, then fresh ones."""
        if seq.block_table:
            raise BlockAccountingError(f"sequence {seq.seq_id} already holds blocks")
        if not self.can_allocate(seq, cached):
            raise BlockAccountingError(f"not enough free blocks for sequence {seq.seq_id}")
        for block_id in cached:
            if self._ref_counts[block_id] == 0:
                del self._evictable[block_id]
            self._ref_counts[block_id] += 1
        seq.block_table = list(cached)
        for _ in range(self.blocks_needed(seq.num_tokens) - len(cached)):
            seq.block_table.append(self._take_fresh())
        seq.num_computed_tokens = len(cached) * self.block_size
        if seq.num_output_tokens == 0 and seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = seq.num_computed_tokens
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_computed_tokens

    def can_append(self, seq: Sequence) -> bool:
        return len(seq.block_table) >= self.blocks_needed(seq.num_tokens) or self.num_available > 0

    def append_slot(self, seq: Sequence) -> None:
        """Make room for the newest token of a decoding sequence."""
        if len(seq.block_table) < self.blocks_needed(seq.num_tokens):
            seq.block_table.append(self._take_fresh())

    def reserve(self, seq: Sequence, num_tokens: int, keep: int) -> int:
        """Grow `seq`'s blocks towards `num_tokens` slots (for a draft past its tokens) while
        more than `keep` blocks stay available; how many of those slots it holds now."""
        while len(seq.block_table) < self.blocks_needed(num_tokens) and self.num_available > keep:
            seq.block_table.append(self._take_fresh())
        return min(num_tokens, len(seq.block_table) * self.block_size)

    def trim(self, seq: Sequence) -> None:
        """Return the blocks past `seq`'s tokens (taken for a draft it did not keep)."""
        while len(seq.block_table) > self.blocks_needed(seq.num_tokens):
            block_id = seq.block_table.pop()
            if self._ref_counts[block_id] != 1 or self._block_hash[block_id] is not None:
                raise BlockAccountingError(f"block {block_id} past the tokens is shared")
            self._ref_counts[block_id] = 0
            self._free.appendleft(block_id)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references. Tail blocks go first in line for eviction."""
        for block_id in reversed(seq.block_table):
            count = self._ref_counts[block_id] - 1
            if count < 0:
                raise BlockAccountingError(f"block {block_id} freed more often than taken")
            self._ref_counts[block_id] = count
            if count == 0:
                if self._block_hash[block_id] is not None:
                    self._evictable[block_id] = None
                else:
                    self._free.append(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def register_computed(self, seq: Sequence) -> None:
        """Publish `seq`'s blocks that are now full and computed, so others can reuse them."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed_tokens // self.block_size
        self._extend_hashes(seq, full)
        for index in range(full):
            block_id = seq.block_table[index]
            if self._block_hash[block_id] is not None:
                continue
            block_hash = seq.block_hashes[index]
            if block_hash in self._hash_to_block:
                continue  # computed twice concurrently; the first copy serves later lookups
            self._block_hash[block_id] = block_hash
            self._hash_to_block[block_hash] = block_id

    def reset_prefix_cache(self) -> None:
        """Forget every unreferenced cached block (e.g. for benchmarks)."""
        while self._evictable:
            block_id, _ = self._evictable.popitem(last=False)
            self._forget(block_id)
            self._free.append(block_id)

    # -- internals ------------------------------------------------------------------------

    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        size = self.block_size
        extra = seq.cache_salt.encode() + b"\x00" + self._model_key
        while len(seq.block_hashes) < num_full_blocks:
            index = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else b""
            tokens = seq.token_ids[index * size : (index + 1) * size]
            seq.block_hashes.append(hash_block(parent, tokens, extra))

    def _take_fresh(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        elif self._evictable:
            block_id, _ = self._evictable.popitem(last=False)
            self._forget(block_id)
        else:
            raise BlockAccountingError("the KV pool is exhausted")
        self._ref_counts[block_id] = 1
        return block_id

    def _forget(self, block_id: int) -> None:
        block_hash = self._block_hash[block_id]
        if block_hash is not None:
            self._block_hash[block_id] = None
            if self._hash_to_block.get(block_hash) == block_id:
                del self._hash_to_block[block_hash]
