"""Paged attention on plain PyTorch: write new K/V into the pool, attend over gathered blocks.

The pool (engine/kv_pool.py) is head-major, `[kv_heads, slots, head_dim]` a layer, so
that gathering a batch's slots gives each head's keys contiguous, ready for batched
matmuls without a copy (16 sequences of 240 tokens: 0.49 against 0.74 ms a layer with the
slot-major layout). Model code sees only an `AttentionContext`, never the scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
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
class SharedPrefix:
    """Cached context that several prefill chunks of a step begin with (the same blocks,
    shared through the prefix cache), and the rest of each chunk's context, padded.

    Their queries attend to the prefix together, in one call over its keys read once
    (cascade attention), then to their own context in one batched call, and the two
    results merge by their log-sum-exps. 15 requests that share an 800-token system
    message prefill their questions in one step; per chunk and layer, a call each cost
    more than the arithmetic.

    `slots`: the prefix's slots. `chunks`: the chunks' indexes in
    `AttentionContext.prefills`, in row order. `own_slots` `[chunks, width]`: each chunk's
    context after the prefix, padded with its first slot. `own_mask` `[chunks, rows,
    width]`: what each query row sees of it (a padding row sees the first slot, so that
    no row is all masked). `rows`: the real rows' indexes in the flattened `[chunks,
    rows]` grid, in the order of the queries.
    """

    slots: torch.Tensor
    chunks: tuple[int, ...]
    own_slots: torch.Tensor
    own_mask: torch.Tensor
    rows: torch.Tensor

    @classmethod
    def of(
        cls, slots: torch.Tensor, prefills: Sequence[PrefillChunk], chunks: tuple[int, ...]
    ) -> SharedPrefix:
        """The prefix `slots` that `prefills[i]` for i in `chunks` begin with (each has a
        cached context, so a mask), and the padded grid of their own contexts."""
        members = [prefills[i] for i in chunks]
        shared = slots.shape[0]
        width = max(c.mask.shape[1] for c in members if c.mask is not None) - shared
        padded_rows = max(c.length for c in members)
        device = slots.device
        own_slots = torch.empty(len(members), width, dtype=torch.long, device=device)
        own_mask = torch.zeros(len(members), padded_rows, width, dtype=torch.bool, device=device)
        own_mask[:, :, 0] = True
        rows: list[int] = []
        for i, chunk in enumerate(members):
            if chunk.context_slots is None or chunk.mask is None:
                raise ValueError("a chunk without cached context shares no prefix")
            own = chunk.context_slots[shared:]
            own_slots[i] = own[0]
            own_slots[i, : own.shape[0]] = own
            own_mask[i, : chunk.length, : own.shape[0]] = chunk.mask[:, shared:]
            rows.extend(range(i * padded_rows, i * padded_rows + chunk.length))
        return cls(slots, chunks, own_slots, own_mask, torch.tensor(rows, device=device))


@dataclass(frozen=True, slots=True)
class AttentionContext:
    """Where this step's tokens go in the pool and what each of them attends to.

    The first `num_decodes` rows are single-token steps, batched together: `decode_slots`
    is `[num_decodes, max_context]` (padded), `decode_mask` marks real positions (None when
    no row is padded). `shared_prefixes` group the prefill chunks that begin with the same
    cached context (on CPUs; see `SharedPrefix`).
    """

    slot_mapping: torch.Tensor
    num_decodes: int
    decode_slots: torch.Tensor | None
    decode_mask: torch.Tensor | None
    prefills: tuple[PrefillChunk, ...]
    shared_prefixes: tuple[SharedPrefix, ...] = ()

    def without_decodes(self) -> AttentionContext:
        """The context of the rows after the decodes, renumbered from 0: a step's prefill
        chunks, for when its decodes run elsewhere."""
        nd = self.num_decodes
        chunks = tuple(replace(chunk, start=chunk.start - nd) for chunk in self.prefills)
        return AttentionContext(self.slot_mapping[nd:], 0, None, None, chunks, self.shared_prefixes)


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
    chunk_outputs: list[torch.Tensor | None] = [None] * len(ctx.prefills)
    for shared in ctx.shared_prefixes:
        members = [ctx.prefills[i] for i in shared.chunks]
        for index, out in zip(
            shared.chunks, _cascade(q, k_cache, v_cache, shared, members), strict=True
        ):
            chunk_outputs[index] = out
    for chunk, done in zip(ctx.prefills, chunk_outputs, strict=True):
        if done is not None:
            outputs.append(done)
            continue
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


def _cascade(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    shared: SharedPrefix,
    chunks: list[PrefillChunk],
) -> list[torch.Tensor]:
    """Attention of the chunks of `shared` (see `SharedPrefix`). -> one `[length, heads *
    dim]` output per chunk.

    A KV head's query heads are laid out as one sequence of `group * rows` queries, so the
    calls need no repeated keys; the prefix needs no mask (every query comes after it).
    """
    kv_heads, _, head_dim = k_cache.shape
    num_heads = q.shape[1]
    group = num_heads // kv_heads
    num_chunks, width = shared.own_slots.shape
    padded_rows = shared.own_mask.shape[1]
    queries = torch.cat([q[c.start : c.start + c.length] for c in chunks])
    total = queries.shape[0]
    by_kv_head = queries.view(total, kv_heads, group, head_dim).permute(1, 2, 0, 3)
    prefix_out, prefix_lse = _attention_with_lse(
        by_kv_head.reshape(1, kv_heads, group * total, head_dim),
        k_cache.index_select(1, shared.slots).unsqueeze(0),
        v_cache.index_select(1, shared.slots).unsqueeze(0),
        None,
    )
    grid = queries.new_zeros(num_chunks * padded_rows, num_heads, head_dim)
    grid.index_copy_(0, shared.rows, queries)
    grid_queries = (
        grid.view(num_chunks, padded_rows, kv_heads, group, head_dim)
        .permute(0, 2, 3, 1, 4)
        .reshape(num_chunks, kv_heads, group * padded_rows, head_dim)
    )
    flat_slots = shared.own_slots.reshape(-1)

    def own(cache: torch.Tensor) -> torch.Tensor:
        gathered = cache.index_select(1, flat_slots).view(kv_heads, num_chunks, width, head_dim)
        return gathered.transpose(0, 1).contiguous()

    blocked = torch.zeros(shared.own_mask.shape, dtype=q.dtype, device=q.device)
    blocked.masked_fill_(~shared.own_mask, float("-inf"))
    own_out, own_lse = _attention_with_lse(
        grid_queries, own(k_cache), own(v_cache), blocked.unsqueeze(1).repeat(1, 1, group, 1)
    )
    # Back from the grid to the prefix's layout, [kv_heads, group, total(, dim)].
    own_out = (
        own_out.view(num_chunks, kv_heads, group, padded_rows, head_dim)
        .permute(1, 2, 0, 3, 4)
        .reshape(kv_heads, group, num_chunks * padded_rows, head_dim)
        .index_select(2, shared.rows)
    )
    own_lse = (
        own_lse.view(num_chunks, kv_heads, group, padded_rows)
        .permute(1, 2, 0, 3)
        .reshape(kv_heads, group, num_chunks * padded_rows)
        .index_select(2, shared.rows)
    )
    prefix_lse = prefix_lse.view(kv_heads, group, total)
    lse = torch.logaddexp(prefix_lse, own_lse)
    merged = prefix_out.view(kv_heads, group, total, head_dim) * torch.exp(
        prefix_lse - lse
    ).unsqueeze(-1)
    merged += own_out * torch.exp(own_lse - lse).unsqueeze(-1)
    out = merged.to(q.dtype).permute(2, 0, 1, 3).reshape(total, num_heads * head_dim)
    return list(torch.split(out, [c.length for c in chunks]))


def _attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's CPU flash attention, which also returns each query's log-sum-exp of its
    scores (float32); `mask` is additive, in q's dtype."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    result = flash(q, k, v, attn_mask=mask)
    return result[0], result[1]
