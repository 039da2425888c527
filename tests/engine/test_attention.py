"""Paged attention's decode path for several sequences in bf16 matches float attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention import AttentionContext, paged_attention
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
