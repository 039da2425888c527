"""The Llama family (SmolLM2, Llama 2/3, Qwen2, Mistral) written for paged attention.

Weights are taken from a transformers model after it has loaded them (HF folder or GGUF),
so every format transformers reads works here, or read back as an earlier start prepared
them (engine/prepared_weights.py). The layers are plain tensors and
functional calls: at this model size per-op overhead matters more than FLOPs, so Q/K/V and
gate/up are fused into one matmul each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.attention import AttentionContext, paged_attention
from engine.kv_pool import KVLayout, KVPool
from engine.linear import (
    FBGEMM_FORMATS,
    Int8Linear,
    Linear,
    WeightFormat,
    fbgemm_supported,
    make_linear,
    make_output_projection,
)
from engine.smoothing import layer_scales
from engine.types import EngineError

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
_SEQ_LEN_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


class UnsupportedModel(EngineError):
    """The model's architecture or settings are outside what the paged engine implements."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The dimensions the KV pool and attention need."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_positions: int


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear


@dataclass(slots=True)
class LlamaWeights:
    """The tensors a `PagedLlama` computes with, in its serving format: what
    engine/prepared_weights.py saves between starts."""

    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: Linear
    layers: list[LayerWeights]


def _bias(*linears: Any) -> torch.Tensor | None:
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    parts = [
        b.detach() if b is not None else torch.zeros(lin.out_features, dtype=lin.weight.dtype)
        for b, lin in zip(biases, linears, strict=True)
    ]
    return torch.cat(parts)


def shape_of(config: Any) -> ModelShape:
    """The dimensions of a transformers config, refusing architectures we don't run."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(
            f"model type {config.model_type!r} is not supported by the paged engine "
            f"(supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
        )
    if getattr(config, "use_sliding_window", False):
        raise UnsupportedModel("sliding-window attention is not supported by the paged engine")
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelShape(
        num_layers=int(config.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        hidden_size=int(config.hidden_size),
        vocab_size=int(config.vocab_size),
        max_positions=int(config.max_position_embeddings),
    )


def rope_tables(
    config: Any, max_positions: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position, `[max_positions, head_dim]`, as transformers computes."""
    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type in _SEQ_LEN_DEPENDENT_ROPE:
        raise UnsupportedModel(f"rope scaling {rope_type!r} is not supported by the paged engine")
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise UnsupportedModel(f"unknown rope scaling {rope_type!r}")
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * attention_scaling).to(device)
    sin = (emb.sin() * attention_scaling).to(device)
    return cos, sin


def _layer_formats(
    weights: WeightFormat, index: int, num_layers: int
) -> tuple[WeightFormat, WeightFormat]:
    """The formats of layer `index`'s q/k/v, o and gate/up projections, and of its down_proj.

    Under w8a8 the first and last layers and every down_proj (whose input, silu(gate) * up,
    has the widest outliers) keep fp16 weights: int8 activations there cost SmolLM2 most of
    its fidelity, and they hold about 30% of the weights.
    """
    if weights != "w8a8":
        return weights, weights
    if index in (0, num_layers - 1):
        return "fp16", "fp16"
    return "w8a8", "fp16"


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """PyTorch's fused RMSNorm: equal to transformers' in float32, 2x faster on long chunks."""
    return F.rms_norm(x, weight.shape, weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


class PagedLlama:
    """Forward pass over a flat batch of tokens from many sequences."""

    def __init__(
        self, config: Any, weights: LlamaWeights, device: torch.device, dtype: torch.dtype
    ) -> None:
        """`config`: the transformers config the weights belong to."""
        self.shape = shape_of(config)
        self.device = device
        self.dtype = dtype
        self.eps = float(config.rms_norm_eps)
        self.embed = weights.embed
        self.final_norm = weights.final_norm
        self.lm_head = weights.lm_head
        self.layers = weights.layers
        cos, sin = rope_tables(config, self.shape.max_positions, device)
        self.cos = cos.to(dtype)
        self.sin = sin.to(dtype)

    @classmethod
    def from_hf(
        cls,
        hf_model: Any,
        device: torch.device,
        dtype: torch.dtype,
        weights: WeightFormat = "float",
        calibration_ids: Sequence[int] = (),
    ) -> PagedLlama:
        """The model of a loaded transformers model, its projections in format `weights`.
        `calibration_ids` (w8a8 only): text the smoothing scales are calibrated on."""
        if weights in FBGEMM_FORMATS and (device.type != "cpu" or not fbgemm_supported()):
            raise UnsupportedModel(f"{weights} weights run on x86 CPUs only (fbgemm)")
        config = hf_model.config
        shape = shape_of(config)  # refuses an architecture before any weight is converted

        def take(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(device=device, dtype=dtype).contiguous()

        def opt(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else take(t)

        def linear(fmt: WeightFormat, *parts: Any, scale: torch.Tensor | None = None) -> Linear:
            weight = torch.cat([p.weight.detach() for p in parts])
            if scale is not None:  # smoothing: input channel j multiplied by scale[j]
                weight = weight * scale.to(weight.device, weight.dtype)
            return make_linear(weight.to(device), opt(_bias(*parts)), dtype, fmt)

        def norm(weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
            weight = weight.detach()
            return take(weight if scale is None else weight / scale.to(weight.device))

        inner = hf_model.model
        embed = take(inner.embed_tokens.weight)
        hf_lm_head = hf_model.get_output_embeddings()
        tied = hf_lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr()
        # Float weights share the tied embedding; quantized ones start from full precision.
        shared = tied and weights == "float"
        lm_head = make_output_projection(
            embed if shared else hf_lm_head.weight.detach().to(device), dtype, weights
        )
        if tied and isinstance(lm_head, Int8Linear):
            # The lookup reads the output projection's dequantized twin: one vocabulary-sized
            # table instead of two (54 MiB for SmolLM2), and every path sees the same values.
            embed = lm_head.dense
        smoothing = layer_scales(hf_model, list(calibration_ids)) if weights == "w8a8" else None
        layers: list[LayerWeights] = []
        for i, hf_layer in enumerate(inner.layers):
            attn, mlp = hf_layer.self_attn, hf_layer.mlp
            fmt, down_fmt = _layer_formats(weights, i, shape.num_layers)
            scales = smoothing[i] if smoothing is not None and fmt == "w8a8" else None
            qkv_scale = None if scales is None else scales.qkv
            gate_up_scale = None if scales is None else scales.gate_up
            layers.append(
                LayerWeights(
                    input_norm=norm(hf_layer.input_layernorm.weight, qkv_scale),
                    qkv=linear(fmt, attn.q_proj, attn.k_proj, attn.v_proj, scale=qkv_scale),
                    o=linear(fmt, attn.o_proj),
                    post_norm=norm(hf_layer.post_attention_layernorm.weight, gate_up_scale),
                    gate_up=linear(fmt, mlp.gate_proj, mlp.up_proj, scale=gate_up_scale),
                    down=linear(down_fmt, mlp.down_proj),
                )
            )
        final_norm = take(inner.norm.weight)
        return cls(config, LlamaWeights(embed, final_norm, lm_head, layers), device, dtype)

    def weights(self) -> LlamaWeights:
        return LlamaWeights(self.embed, self.final_norm, self.lm_head, self.layers)

    @property
    def kv_layout(self) -> KVLayout:
        """What the KV pool keeps for this model's attention."""
        shape = self.shape
        return KVLayout(shape.num_layers, shape.num_kv_heads, shape.head_dim, self.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        pool: KVPool,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (float32) of the rows in `logit_rows`, after writing every token's K/V."""
        shape = self.shape
        num_tokens = input_ids.shape[0]
        q_size = shape.num_heads * shape.head_dim
        kv_size = shape.num_kv_heads * shape.head_dim
        head_dim = shape.head_dim
        qk_heads = shape.num_heads + shape.num_kv_heads
        cos = self.cos.index_select(0, positions).unsqueeze(1)
        sin = self.sin.index_select(0, positions).unsqueeze(1)
        eps = self.eps
        hidden = F.embedding(input_ids, self.embed)
        for layer, cache in zip(self.layers, pool.layers, strict=True):
            x = _rms_norm(hidden, layer.input_norm, eps)
            qkv = layer.qkv(x)
            # Q and K heads sit side by side in the fused output: rotate them in one go.
            qk = _rotate(qkv[:, : q_size + kv_size].view(num_tokens, qk_heads, head_dim), cos, sin)
            q, k = torch.split(qk, [shape.num_heads, shape.num_kv_heads], dim=1)
            v = qkv[:, q_size + kv_size :].view(num_tokens, shape.num_kv_heads, head_dim)
            attn = paged_attention(q, k, v, cache, ctx)
            hidden = hidden + layer.o(attn)
            x = _rms_norm(hidden, layer.post_norm, eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
        if logit_rows.numel() == 0:
            return hidden.new_empty((0, shape.vocab_size), dtype=torch.float32)
        hidden = hidden.index_select(0, logit_rows)
        hidden = _rms_norm(hidden, self.final_norm, eps)
        return self.lm_head(hidden).float()
