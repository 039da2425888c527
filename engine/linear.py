"""The model's projections in one of four weight formats (`WeightFormat`).

Decoding one token per sequence reads every weight once per step, so on a CPU a small
batch is bound by memory bandwidth, not arithmetic:

- `float`: the model's weights in the activations' dtype.
- `fp16`: fp16 weights through fbgemm's fp16 matmul with float activations, for batches
  of up to a few dozen rows; larger ones (prefill chunks) use the same weights densely in
  the activations' dtype. Half of fp32's bytes, and as faithful as bf16 (x86 CPUs).
- `int8`: int8 weights (one scale per 64 input features of an output channel), bf16
  activations. Decode steps run natively (engine/native_decode.py) where a C compiler
  is present; prefill chunks go through the same weights dequantized once at load. Runs
  wherever PyTorch does.
- `w8a8`: int8 weights and int8 activations (one scale per token), through fbgemm's
  dynamic int8 matmul (x86 CPUs). To keep a small model's answers, q/k/v and gate/up are
  smoothed (engine/smoothing.py), and the first and last layers and every down_proj keep
  fp16 weights (engine/llama.py).

Under `fp16` and `w8a8` the output projection (`lm_head`) keeps fp16 weights and returns
float32 logits.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from engine.cpu_info import cpuinfo

WeightFormat = Literal["float", "fp16", "int8", "w8a8"]
# The formats that run on fbgemm's kernels (x86 CPUs only).
FBGEMM_FORMATS: frozenset[WeightFormat] = frozenset({"fp16", "w8a8"})

# Rows up to which the int8 kernel beat the dense bf16 matmul on SmolLM2's shapes (a
# 2-core AVX-512 CPU, one thread): 1 row 25 vs 49 ms a step, 4 rows 42 vs 55, 8 rows 77
# vs 69.
INT8_KERNEL_MAX_ROWS = 4
# PyTorch 2.13's int8 kernel returns garbage (NaN on a tiny Llama) unless the input
# features are a multiple of 16; other shapes take the dense twin.
INT8_KERNEL_FEATURE_MULTIPLE = 16
# Input features per int8 scale (Int8Linear).
INT8_GROUP = 64
# Likewise for fbgemm's fp16 kernel (float activations): 1 row 12 vs 37 ms a step, 16 rows
# 54 vs 63, 64 rows 241 vs 144.
FP16_KERNEL_MAX_ROWS = 24


@dataclass(frozen=True, slots=True)
class DenseLinear:
    """`x @ weight.T + bias` in the model's dtype."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass(slots=True)
class Int8Linear:
    """Symmetric int8 weights, one scale per group of INT8_GROUP input features of an output
    channel (per channel where the features don't divide), with their dequantized twin.

    Groups keep SmolLM2 as good as float (perplexity 28.09 against 28.16; one scale per
    channel: 28.43): its weights come from a GGUF file quantized in blocks of 32, whose
    ranges differ along a row. The engine's native decode step reads `quantized` and
    `scales`; PyTorch's int8 kernel takes only per-channel scales (`kernel_scales`).
    """

    quantized: torch.Tensor  # int8, [out, in]: row-major, or in the native step's tiles
    scales: torch.Tensor  # float32, [out, in // group]
    dense: torch.Tensor  # the dequantized weights, the activations' dtype
    bias: torch.Tensor | None
    kernel_scales: torch.Tensor | None  # [out], the activations' dtype; per-channel only
    tiled: bool = False  # whether `quantized` is laid out in `tiles`

    @property
    def group(self) -> int:
        return self.quantized.shape[1] // self.scales.shape[1]

    def tiles(self, rows: int, depth: int) -> torch.Tensor:
        """The int8 weights laid out tile by tile, `rows` outputs by `depth` features each,
        every tile one sequential stream.

        Grouped weights have no other reader of the row-major order (PyTorch's kernel takes
        only per-channel scales), so they are re-laid in place, once: the model then holds
        one int8 copy however many native decoders read it. Per-channel weights keep theirs
        and get a tiled copy.
        """
        if self.tiled:
            return self.quantized
        out, features = self.quantized.shape
        tiles = self.quantized.view(out // rows, rows, features // depth, depth)
        tiled = tiles.permute(0, 2, 1, 3).contiguous().view(out, features)
        if self.kernel_scales is None:
            self.quantized, self.tiled = tiled, True
        return tiled

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.kernel_scales is None
            or x.shape[0] > INT8_KERNEL_MAX_ROWS
            or x.shape[-1] % INT8_KERNEL_FEATURE_MULTIPLE
        ):
            return F.linear(x, self.dense, self.bias)
        out = torch._weight_int8pack_mm(x.contiguous(), self.quantized, self.kernel_scales)
        return out if self.bias is None else out + self.bias


@dataclass(frozen=True, slots=True)
class W8A8Linear:
    """Int8 weights packed for fbgemm; each token's activations quantized to int8 on the fly.

    fbgemm picks one quantization range for its whole input. Scaling every row to a peak
    of 1 first (and back afterwards; the product is linear in each row) makes that range
    per token, so one token with large activations cannot crush the others' precision.
    """

    packed: Any  # fbgemm's packed weights (a TorchScript object)
    bias: torch.Tensor | None
    reduce_range: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        out: torch.Tensor
        if h.shape[0] == 1:  # one token: fbgemm's range is already its own
            out = _linear_dynamic(h, self.packed, self.reduce_range)
        else:
            peak = h.abs().amax(dim=-1, keepdim=True).clamp(min=1e-6)
            out = _linear_dynamic(h / peak, self.packed, self.reduce_range) * peak
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype)


@dataclass(frozen=True, slots=True)
class Fp16Linear:
    """fp16 weights packed for fbgemm, float activations: near-exact at half fp32's bytes.

    fbgemm's fp16 kernel beats the dense bf16 matmul up to a few dozen rows; larger
    batches (prefill chunks) go through `dense`, the same weights in the activations'
    dtype, when there is one.
    """

    packed: Any
    dense: torch.Tensor | None
    bias: torch.Tensor | None
    out_dtype: torch.dtype | None  # None: the input's dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None and x.shape[0] > FP16_KERNEL_MAX_ROWS:
            return F.linear(x, self.dense, self.bias)
        out: torch.Tensor = _linear_dynamic_fp16(x.float(), self.packed)
        if self.bias is not None:
            out = out + self.bias
        return out.to(self.out_dtype or x.dtype)


Linear = DenseLinear | Int8Linear | W8A8Linear | Fp16Linear

# The ops' overloads, resolved once: calling the packets resolves them on every call.
_linear_dynamic = torch.ops.quantized.linear_dynamic.default
_linear_dynamic_fp16 = torch.ops.quantized.linear_dynamic_fp16.default


def fbgemm_supported() -> bool:
    """Whether this PyTorch build has fbgemm's fp16 and dynamic int8 matmuls (x86 builds do)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


@functools.cache
def _cpu_has_vnni() -> bool:
    """AVX-512 VNNI accumulates int8 products in int32; without it fbgemm needs 7-bit inputs.

    Where the flags can't be read, assume the older CPU: 7 bits are safe everywhere.
    """
    flags = cpuinfo()
    return "avx512_vnni" in flags or "avx_vnni" in flags


def quantize_int8(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 quantization: (int8 weights, scales in `dtype`)."""
    quantized, scales = quantize_int8_groups(weight, weight.shape[1])
    return quantized, scales[:, 0].to(dtype).contiguous()


def quantize_int8_groups(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization by groups of `group` features of a row: (int8 weights,
    float32 scales `[out, in // group]`)."""
    out, features = weight.shape
    w = weight.detach().float().reshape(out, features // group, group)
    scales = w.abs().amax(dim=2).clamp(min=1e-8) / 127.0
    quantized = torch.round(w / scales[:, :, None]).clamp(-127, 127).to(torch.int8)
    return quantized.reshape(out, features).contiguous(), scales.contiguous()


def dequantize_int8_groups(
    quantized: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The dense twin of `quantize_int8_groups`' output, in `dtype`."""
    out, features = quantized.shape
    group = features // scales.shape[1]
    dense = quantized.float().view(out, -1, group) * scales[:, :, None]
    return dense.view_as(quantized).to(dtype).contiguous()


def _make_int8(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> Int8Linear:
    features = weight.shape[1]
    group = INT8_GROUP if features % INT8_GROUP == 0 else features
    quantized, scales = quantize_int8_groups(weight, group)
    kernel_scales = scales[:, 0].to(dtype).contiguous() if group == features else None
    dense = dequantize_int8_groups(quantized, scales, dtype)
    return Int8Linear(quantized, scales, dense, bias, kernel_scales)


def _pack_w8a8(weight: torch.Tensor, bias: torch.Tensor | None) -> W8A8Linear:
    quantized, scales = quantize_int8(weight, torch.float64)
    zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # Quantized tensors are deprecated in later PyTorch releases; torch is pinned here,
        # and this is the only way to hand int8 weights to fbgemm.
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch._make_per_channel_quantized_tensor(quantized, scales, zero_points, 0)
        packed = torch.ops.quantized.linear_prepack(qweight, None)
    float_bias = None if bias is None else bias.float()
    return W8A8Linear(packed, float_bias, reduce_range=not _cpu_has_vnni())


def _pack_fp16(weight: torch.Tensor) -> Any:
    return torch.ops.quantized.linear_prepack_fp16(weight.detach().float(), None)


def make_output_projection(weight: torch.Tensor, dtype: torch.dtype, fmt: WeightFormat) -> Linear:
    """The output projection (`lm_head`), returning float32 logits under fp16 and w8a8.

    It only sees the rows that sample, so it never needs a dense twin.
    """
    if fmt in FBGEMM_FORMATS:
        return Fp16Linear(_pack_fp16(weight), None, None, torch.float32)
    return make_linear(weight, None, dtype, fmt)


def make_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, fmt: WeightFormat
) -> Linear:
    """A projection on `weight`'s device, computing in `dtype`, in weight format `fmt`."""
    if fmt == "float":
        return DenseLinear(weight.to(dtype).contiguous(), bias)
    if fmt == "w8a8":
        return _pack_w8a8(weight, bias)
    if fmt == "fp16":
        return Fp16Linear(_pack_fp16(weight), weight.to(dtype).contiguous(), bias, None)
    return _make_int8(weight, bias, dtype)
