"""Decode steps through engine/native/decode_step.c: a whole step in one native call.

`ModelRunner` builds a `NativeDecoder` over its KV pool once, where the kernel runs the
model (int8 weights on a CPU), and sends it the steps' decodes; the library itself is
built and loaded by engine/native_library.py.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.kv_pool import KVPool
from engine.linear import Int8Linear, Linear
from engine.llama import PagedLlama
from engine.native_library import Layer, Model, Projection, load_library


@dataclass(frozen=True, slots=True)
class PackShape:
    """How the built kernel reads packed weights (`bastion_pack_shape` in decode_step.c):
    int8 weights as `[out / rows][in / depth][rows][depth]`, and the scales as
    `[out / rows][groups][rows]` where `scales_packed`, else row-major."""

    rows: int
    depth: int
    scales_packed: bool

    @classmethod
    def of(cls, library: ctypes.CDLL) -> PackShape:
        shape = (ctypes.c_int64 * 3)()
        library.bastion_pack_shape(shape)
        return cls(shape[0], shape[1], bool(shape[2]))


def _int8(linear: Linear) -> Int8Linear:
    if not isinstance(linear, Int8Linear):
        raise TypeError(f"the native decode step reads int8 weights, not {type(linear).__name__}")
    return linear


@dataclass(frozen=True, slots=True)
class _Int8Weights:
    """An Int8Linear's weights as the kernel reads them (float32 scales and bias)."""

    weight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None
    group: int

    @classmethod
    def of(cls, linear: Linear, library: ctypes.CDLL, pack: PackShape) -> _Int8Weights:
        """The kernel's copy of `linear`'s weights, packed as it reads them where it packs
        this shape (`pack`), else row-major."""
        int8 = _int8(linear)
        weight, group = int8.quantized, int8.group
        out, features = weight.shape
        scales = int8.scales.float().contiguous()
        if library.bastion_packed_layout(out, features, group):
            weight = int8.tiles(pack.rows, pack.depth)
            if pack.scales_packed:
                rows = pack.rows
                scales = scales.view(out // rows, rows, -1).transpose(1, 2).contiguous()
        elif int8.tiled:
            raise ValueError("int8 weights tiled for a native step of another layout")
        bias = None if int8.bias is None else int8.bias.float().contiguous()
        return cls(weight, scales, bias, group)

    def struct(self) -> Projection:
        out, features = self.weight.shape
        return Projection(
            self.weight.data_ptr(),
            self.scale.data_ptr(),
            None if self.bias is None else self.bias.data_ptr(),
            out,
            features,
            self.group,
        )


def supports(model: PagedLlama, kv_dtype: torch.dtype) -> bool:
    """Whether the kernel runs this model: int8 weights on a CPU, a bf16 or float32 KV pool."""
    projections = [model.lm_head] + [
        lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ]
    return (
        model.device.type == "cpu"
        and kv_dtype in (torch.bfloat16, torch.float32)
        and all(isinstance(lin, Int8Linear) for lin in projections)
    )


class NativeDecoder:
    """A model's decode steps through the native kernel, over one KV pool."""

    def __init__(self, library: ctypes.CDLL, model: PagedLlama, pool: KVPool) -> None:
        shape = model.shape
        self._function = library.bastion_decode_step
        self._embed = model.embed
        self.vocab_size = shape.vocab_size
        float_ = torch.float32

        def f32(t: torch.Tensor) -> torch.Tensor:
            return t.to(float_).contiguous()

        # Everything the struct points to must outlive it: keep a reference to each tensor.
        self._keep: list[torch.Tensor | _Int8Weights | ctypes.Array[Layer]] = []
        pack = PackShape.of(library)
        layers = (Layer * shape.num_layers)()
        for struct, layer, cache in zip(layers, model.layers, pool.layers, strict=True):
            norms = (f32(layer.input_norm), f32(layer.post_norm))
            linears = (layer.qkv, layer.o, layer.gate_up, layer.down)
            projections = [_Int8Weights.of(p, library, pack) for p in linears]
            self._keep += [*norms, *projections]
            struct.input_norm, struct.post_norm = (n.data_ptr() for n in norms)
            struct.qkv, struct.o, struct.gate_up, struct.down = (p.struct() for p in projections)
            struct.k_cache, struct.v_cache = cache.keys.data_ptr(), cache.values.data_ptr()
        cos, sin, final_norm = f32(model.cos), f32(model.sin), f32(model.final_norm)
        lm_head = _Int8Weights.of(model.lm_head, library, pack)
        intermediate = _int8(model.layers[0].down).quantized.shape[1]
        self._keep += [cos, sin, final_norm, lm_head, layers]
        self._model = Model(
            num_layers=shape.num_layers,
            hidden=shape.hidden_size,
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            intermediate=intermediate,
            num_slots=pool.num_slots,
            kv_bf16=int(pool.dtype == torch.bfloat16),
            eps=model.eps,
            cos=cos.data_ptr(),
            sin=sin.data_ptr(),
            final_norm=final_norm.data_ptr(),
            lm_head=lm_head.struct(),
            layers=layers,
        )

    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context_slots: torch.Tensor,
        threads: int,
        logit_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Float32 logits `[rows, vocab]` of the rows in `logit_rows` (ascending; None: every
        row), after writing every row's K/V. `context_slots[b, :positions[b] + 1]` are row
        b's slots, its new token's last."""
        batch = input_ids.shape[0]
        embeddings = F.embedding(input_ids, self._embed)
        hidden = embeddings.to(torch.float32, copy=True).contiguous()  # the kernel writes it
        positions = positions.to(torch.int64).contiguous()
        slots = context_slots.to(torch.int64).contiguous()
        if logit_rows is None:
            logit_rows = torch.arange(batch)
        logit_rows = logit_rows.to(torch.int64).contiguous()
        logits = torch.empty(logit_rows.shape[0], self.vocab_size, dtype=torch.float32)
        status = self._function(
            ctypes.byref(self._model),
            batch,
            hidden.data_ptr(),
            positions.data_ptr(),
            slots.data_ptr(),
            slots.shape[1],
            logit_rows.data_ptr(),
            logit_rows.shape[0],
            logits.data_ptr(),
            threads,
        )
        if status != 0:
            raise MemoryError("native decode step could not allocate its scratch buffers")
        return logits


def native_decoder(
    model: PagedLlama, pool: KVPool, enabled: bool = True, cache_dir: Path | None = None
) -> NativeDecoder | None:
    """A decoder over `pool` where the native step is enabled, its library loads (from
    `cache_dir`, engine/native_library.py) and its kernel runs `model`; else None."""
    if not supports(model, pool.dtype):
        return None
    library = load_library(enabled, cache_dir)
    return None if library is None else NativeDecoder(library, model, pool)
