"""The model's projections: dense weights, or int8 weights for memory-bound decoding.

Decoding one token per sequence reads every weight once per step, so on a CPU a small
batch is bound by memory bandwidth, not arithmetic. Int8 weights (one scale per output
channel) halve the bytes of bf16 and quarter those of fp32. PyTorch's int8 weight-only
kernel wins only for a few rows, though: for prefill chunks and large decode batches the
same weights, dequantized once at load, go through the dense matmul instead. Both paths
compute with identical weight values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Rows up to which the int8 kernel beat the dense bf16 matmul on SmolLM2's shapes (a
# 2-core AVX-512 CPU, one thread): 1 row 25 vs 49 ms a step, 4 rows 42 vs 55, 8 rows 77
# vs 69.
INT8_KERNEL_MAX_ROWS = 4


@dataclass(frozen=True, slots=True)
class DenseLinear:
    """`x @ weight.T + bias` in the model's dtype."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass(frozen=True, slots=True)
class Int8Linear:
    """Per-output-channel symmetric int8 weights, with their dequantized dense twin."""

    quantized: torch.Tensor  # int8, [out, in]
    scales: torch.Tensor  # [out], the activations' dtype
    dense: torch.Tensor  # quantized * scales, the activations' dtype
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > INT8_KERNEL_MAX_ROWS:
            return F.linear(x, self.dense, self.bias)
        out = torch._weight_int8pack_mm(x.contiguous(), self.quantized, self.scales)
        return out if self.bias is None else out + self.bias


Linear = DenseLinear | Int8Linear


def quantize_int8(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 quantization: (int8 weights, scales in `dtype`)."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    quantized = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return quantized.contiguous(), scales.to(dtype).contiguous()


def make_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, int8: bool
) -> Linear:
    """A projection on `weight`'s device, computing in `dtype`, optionally from int8."""
    if not int8:
        return DenseLinear(weight.to(dtype).contiguous(), bias)
    quantized, scales = quantize_int8(weight, dtype)
    dense = (quantized.to(dtype) * scales[:, None]).contiguous()
    return Int8Linear(quantized, scales, dense, bias)
