"""Block pool bookkeeping: allocation, chained prefix hashes, tenants, ref counts, LRU."""

from __future__ import annotations

import pytest

from engine.block_manager import BlockAccountingError, BlockManager
from engine.sequence import Sequence
from engine.types import SamplingParams


def seq(tokens: list[int], salt: str = "", name: str = "s") -> Sequence:
    return Sequence(name, list(tokens), len(tokens), SamplingParams(), salt)


def admit(blocks: BlockManager, s: Sequence) -> list[int]:
    cached = blocks.find_cached_prefix(s)
    blocks.allocate(s, cached)
    return cached


def compute_all(blocks: BlockManager, s: Sequence) -> None:
    s.num_computed_tokens = s.num_tokens
    blocks.register_computed(s)


def test_allocation_covers_every_token_and_free_returns_all() -> None:
    blocks = BlockManager(8, 4, "m")
    s = seq(list(range(10)))
    admit(blocks, s)
    assert len(s.block_table) == 3
    assert blocks.counts().used == 3
    blocks.free(s)
    assert blocks.counts().used == 0
    assert blocks.counts().free == 8


def test_a_shared_prefix_is_found_and_reference_counted() -> None:
    blocks = BlockManager(16, 4, "m")
    first = seq(list(range(10)), name="a")
    admit(blocks, first)
    compute_all(blocks, first)
    second = seq([*range(8), 99, 98, 97], name="b")
    cached = admit(blocks, second)
    assert cached == first.block_table[:2]
    assert second.num_computed_tokens == 8
    assert all(blocks.ref_count(b) == 2 for b in cached)
    blocks.free(first)
    blocks.free(second)
    counts = blocks.counts()
    assert counts.used == 0
    assert counts.cached == 2  # the two full blocks stay findable


def test_the_last_token_is_never_served_from_cache() -> None:
    blocks = BlockManager(16, 4, "m")
    first = seq(list(range(8)), name="a")
    admit(blocks, first)
    compute_all(blocks, first)
    again = seq(list(range(8)), name="b")
    cached = admit(blocks, again)
    assert len(cached) == 1  # the second block holds the last token: recomputed
    assert again.num_computed_tokens == 4


def test_two_tenants_never_share_a_block() -> None:
    blocks = BlockManager(16, 4, "m")
    a = seq(list(range(12)), salt="tenant-a", name="a")
    admit(blocks, a)
    compute_all(blocks, a)
    b = seq(list(range(12)), salt="tenant-b", name="b")
    assert admit(blocks, b) == []
    assert not set(a.block_table) & set(b.block_table)


def test_a_different_first_block_changes_every_later_hash() -> None:
    blocks = BlockManager(16, 4, "m")
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], name="a")
    admit(blocks, a)
    compute_all(blocks, a)
    b = seq([0, 2, 3, 4, 5, 6, 7, 8, 9], name="b")  # same second block, different parent
    assert admit(blocks, b) == []


def test_least_recently_freed_cached_block_is_evicted_first() -> None:
    blocks = BlockManager(4, 4, "m")
    old = seq(list(range(5)), name="old")
    admit(blocks, old)
    compute_all(blocks, old)
    blocks.free(old)
    new = seq(list(range(100, 105)), name="new")
    admit(blocks, new)
    compute_all(blocks, new)
    blocks.free(new)
    assert blocks.counts().cached == 2
    # Needs 3 fresh blocks: 2 never-hashed free ones first, then the oldest cached one.
    third = seq(list(range(200, 212)), name="third")
    admit(blocks, third)
    assert blocks.find_cached_prefix(seq(list(range(100, 105)), name="probe"))
    assert not blocks.find_cached_prefix(seq(list(range(5)), name="probe2"))


def test_over_allocation_and_double_free_are_refused() -> None:
    blocks = BlockManager(2, 4, "m")
    big = seq(list(range(9)))
    assert not blocks.can_allocate(big, [])
    with pytest.raises(BlockAccountingError):
        blocks.allocate(big, [])
    ok = seq(list(range(3)))
    admit(blocks, ok)
    table = list(ok.block_table)
    blocks.free(ok)
    ok.block_table = table
    with pytest.raises(BlockAccountingError):
        blocks.free(ok)


def test_hit_rate_counts_prompt_tokens() -> None:
    blocks = BlockManager(16, 4, "m")
    a = seq(list(range(9)), name="a")
    admit(blocks, a)
    compute_all(blocks, a)
    admit(blocks, seq(list(range(9)), name="b"))
    assert blocks.prefix_queries == 18
    assert blocks.prefix_hits == 8
    assert blocks.hit_rate == pytest.approx(8 / 18)
