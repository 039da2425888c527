"""Paged attention: the decode path for several sequences in bf16 matches float attention,
and chunks that share a cached prefix attend to it together as they would one by one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.attention import AttentionContext, PrefillChunk, SharedPrefix, paged_attention
from engine.kv_pool import LayerKV


def test_batched_bf16_decode_matches_float_reference() -> None:
    torch.manual_seed(0)
    kv_heads, group, head_dim, slots = 2, 3, 16, 64
    lengths = [5, 17, 9]
    k_cache = torch.randn(kv_heads, slots, head_dim)  # head-major, as the pool
    v_cache = torch.randn(kv_heads, slots, head_dim)
    width = max(lengths)
    # Each sequence owns a disjoint run of slots; its newest token is the last one.
    starts = [0, 20, 40]
    table = torch.tensor(
        [[s + min(i, n - 1) for i in range(width)] for s, n in zip(starts, lengths, strict=True)]
    )
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    new_slots = torch.tensor([s + n - 1 for s, n in zip(starts, lengths, strict=True)])
    q = torch.randn(3, kv_heads * group, head_dim)
    k_new, v_new = torch.randn(3, kv_heads, head_dim), torch.randn(3, kv_heads, head_dim)
    ctx = AttentionContext(new_slots, 3, table, mask, ())
    pool = LayerKV(k_cache.bfloat16(), v_cache.bfloat16())
    out = paged_attention(q.bfloat16(), k_new.bfloat16(), v_new.bfloat16(), pool, ctx)
    k_cache[:, new_slots], v_cache[:, new_slots] = k_new.transpose(0, 1), v_new.transpose(0, 1)
    for row, (start, n) in enumerate(zip(starts, lengths, strict=True)):
        keys = k_cache[:, start : start + n]  # [kv_heads, n, dim]
        values = v_cache[:, start : start + n]
        query = q[row].view(kv_heads, group, head_dim)
        expected = F.scaled_dot_product_attention(query, keys, values).reshape(-1)
        torch.testing.assert_close(out[row].float(), expected, rtol=0.03, atol=0.03)


def _chunk(row: int, prefix: list[int], cached: list[int], new: list[int]) -> PrefillChunk:
    """A prefill chunk of `new` slots after `prefix` and `cached`, causal within itself."""
    context = torch.tensor(prefix + cached + new)
    before = len(prefix) + len(cached)
    q_pos = torch.arange(before, before + len(new))
    mask = torch.arange(len(context))[None, :] <= q_pos[:, None]
    return PrefillChunk(row, len(new), context, mask)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 0.03)])
def test_chunks_sharing_a_cached_prefix_attend_as_they_do_one_by_one(
    dtype: torch.dtype, tolerance: float
) -> None:
    """Cascade attention (the shared prefix once for all the chunks, then each chunk's own
    context, merged) gives each chunk what attending over its whole context gives, beside
    a decode row and a chunk outside the group, with grouped query heads."""
    torch.manual_seed(1)
    kv_heads, group, head_dim, slots = 3, 3, 64, 400
    k_cache = torch.randn(kv_heads, slots, head_dim, dtype=dtype)
    v_cache = torch.randn(kv_heads, slots, head_dim, dtype=dtype)
    prefix = list(range(0, 96))
    # (cached after the prefix, new) slots: chunks of different lengths, with and without
    # cached context of their own after the prefix (40 tokens for the second).
    owns = [([], list(range(100, 105))), (list(range(110, 150)), list(range(150, 153)))]
    owns += [([], list(range(160, 169))), (list(range(170, 172)), list(range(172, 174)))]
    decode_table = torch.tensor([list(range(300, 320))])
    chunks, row = [], 1  # row 0: the decode
    for cached, new in owns:
        chunks.append(_chunk(row, prefix, cached, new))
        row += len(new)
    outsider = _chunk(row, list(range(200, 290)), [], list(range(290, 296)))
    prefills = (chunks[0], chunks[1], outsider, chunks[2], chunks[3])
    rows = row + outsider.length
    new_slots = torch.cat([torch.tensor([319])] + [c.context_slots[-c.length :] for c in prefills])
    q = torch.randn(rows, kv_heads * group, head_dim, dtype=dtype)
    k_new = torch.randn(rows, kv_heads, head_dim, dtype=dtype)
    v_new = torch.randn(rows, kv_heads, head_dim, dtype=dtype)
    shared = SharedPrefix.of(torch.tensor(prefix), prefills, (0, 1, 3, 4))

    def attend(shared_prefixes: tuple[SharedPrefix, ...]) -> torch.Tensor:
        ctx = AttentionContext(new_slots, 1, decode_table, None, prefills, shared_prefixes)
        pool = LayerKV(k_cache.clone(), v_cache.clone())
        return paged_attention(q, k_new, v_new, pool, ctx)

    one_by_one, cascaded = attend(()), attend((shared,))
    assert cascaded.dtype == dtype and cascaded.shape == one_by_one.shape
    torch.testing.assert_close(cascaded.float(), one_by_one.float(), rtol=tolerance, atol=tolerance)


def test_a_chunk_without_cached_context_shares_no_prefix() -> None:
    whole = PrefillChunk(0, 4, None, None)
    with pytest.raises(ValueError, match="shares no prefix"):
        SharedPrefix.of(torch.arange(16), (whole, _chunk(4, list(range(16)), [], [20, 21])), (0, 1))
