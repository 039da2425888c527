"""Paged attention on plain PyTorch: write new K/V into the pool, attend over gathered blocks.

The pool (engine/kv_pool.py) is head-major, `[kv_heads, slots, head_dim]` a layer, so
that gathering a batch's slots gives each head's keys contiguous, ready for batched
matmuls without a copy (16 sequences of 240 tokens: 0.49 against 0.74 ms a layer with the
slot-major layout). Model code sees only an `AttentionContext`, never the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from engine.kv_pool import LayerKV


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """One sequence's chunk of new tokens, rows `start:start + length` of the step's batch.

    `context_slots` lists the slots of every token the chunk attends to (the cached prefix,
    then the chunk itself); None means the chunk is the whole context (no cached prefix).
    """

    start: int
    length: int
    context_slots: torch.Tensor | None
    mask: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class AttentionContext:
    """Where this step's tokens go in the pool and what each of them attends to.

    The first `num_decodes` rows are single-token steps, batched together: `decode_slots`
    is `[num_decodes, max_context]` (padded), `decode_mask` marks real positions (None when
    no row is padded).
    """

    slot_mapping: torch.Tensor
    num_decodes: int
    decode_slots: torch.Tensor | None
    decode_mask: torch.Tensor | None
    prefills: tuple[PrefillChunk, ...]

    def without_decodes(self) -> AttentionContext:
        """The context of the rows after the decodes, renumbered from 0: a step's prefill
        chunks, for when its decodes run elsewhere."""
        nd = self.num_decodes
        chunks = tuple(replace(chunk, start=chunk.start - nd) for chunk in self.prefills)
        return AttentionContext(self.slot_mapping[nd:], 0, None, None, chunks)


def _batched_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One query per sequence, in bf16/fp16 on a CPU: two matmuls and a float32 softmax.

    PyTorch's fused CPU kernel is slow for this shape in reduced precision (16 sequences of
    240 tokens, SmolLM2's heads: 0.74 ms a layer against 0.27 ms here).
    """
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: LayerKV,
    ctx: AttentionContext,
) -> torch.Tensor:
    """Attention for a step. q: [T, heads, dim]; k, v: [T, kv_heads, dim] -> [T, heads * dim]."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    cache.store(ctx.slot_mapping, k, v)
    k_cache, v_cache = cache.keys, cache.values
    outputs: list[torch.Tensor] = []
    nd = ctx.num_decodes
    if nd:
        assert ctx.decode_slots is not None
        width = ctx.decode_slots.shape[1]
        flat = ctx.decode_slots.reshape(-1)
        # One query per sequence, batched over (K/V head, sequence): a head's query heads
        # share its keys.
        kd = k_cache.index_select(1, flat).view(num_kv_heads, nd, width, head_dim)
        vd = v_cache.index_select(1, flat).view(num_kv_heads, nd, width, head_dim)
        qd = q[:nd].view(nd, num_kv_heads, group, head_dim).transpose(0, 1)
        mask = None if ctx.decode_mask is None else ctx.decode_mask.view(1, nd, 1, width)
        if nd > 1 and q.device.type == "cpu" and q.dtype != torch.float32:
            out = _batched_decode_attention(qd, kd, vd, mask)
        else:
            out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask)
        outputs.append(out.transpose(0, 1).reshape(nd, num_heads * head_dim))
    for chunk in ctx.prefills:
        rows = slice(chunk.start, chunk.start + chunk.length)
        qp = q[rows].transpose(0, 1).unsqueeze(0)
        if chunk.context_slots is None:
            kp = k[rows].transpose(0, 1).unsqueeze(0)
            vp = v[rows].transpose(0, 1).unsqueeze(0)
            out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
        else:
            kp = k_cache.index_select(1, chunk.context_slots).unsqueeze(0)
            vp = v_cache.index_select(1, chunk.context_slots).unsqueeze(0)
            out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=chunk.mask, enable_gqa=True)
        outputs.append(out[0].transpose(0, 1).reshape(chunk.length, num_heads * head_dim))
    if len(outputs) == 1:
        return outputs[0]
    result = torch.cat(outputs)
    assert result.shape[0] == num_tokens
    return result
