"""Decode steps through engine/native/decode_step.c: a whole step in one native call.

The C source ships with the package and is compiled on first use with the machine's C
compiler (`-march=native`), into a cache keyed by the source, the compiler and
the CPU. Where there is no compiler or it fails, the engine keeps its PyTorch path: the
native step is an accelerator, never a requirement.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch

from engine.cpu_info import cpuinfo
from engine.linear import Int8Linear

log = structlog.get_logger(__name__)

SOURCE = Path(__file__).with_name("native") / "decode_step.c"
CACHE_ENV = "BASTION_NATIVE_CACHE"
DISABLE_ENV = "BASTION_NATIVE_DECODE"
_COMPILE_FLAGS = ("-O3", "-march=native", "-pthread", "-shared", "-fPIC")

# The shape of the kernel's weight tiles (TILE_ROWS, TILE_DEPTH in decode_step.c).
_TILE_ROWS = 4
_TILE_DEPTH = 32

_int64 = ctypes.c_int64
_ptr = ctypes.c_void_p


class _Projection(ctypes.Structure):
    _fields_ = [
        ("weight", _ptr),
        ("scale", _ptr),
        ("bias", _ptr),
        ("out", _int64),
        ("in_", _int64),
        ("group", _int64),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _ptr),
        ("post_norm", _ptr),
        ("qkv", _Projection),
        ("o", _Projection),
        ("gate_up", _Projection),
        ("down", _Projection),
        ("k_cache", _ptr),
        ("v_cache", _ptr),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("num_layers", _int64),
        ("hidden", _int64),
        ("num_heads", _int64),
        ("num_kv_heads", _int64),
        ("head_dim", _int64),
        ("intermediate", _int64),
        ("num_slots", _int64),
        ("kv_bf16", _int64),
        ("eps", ctypes.c_float),
        ("cos", _ptr),
        ("sin", _ptr),
        ("final_norm", _ptr),
        ("lm_head", _Projection),
        ("layers", ctypes.POINTER(_Layer)),
    ]


def _cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bastion" / "native"


def _cpu_identity() -> str:
    """The CPU's model name and feature flags: a library built with `-march=native` runs
    only where both match (one model name can span CPU generations)."""
    lines = [line for line in cpuinfo().splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(lines)) or platform.processor()


def _build(compiler: str) -> Path:
    """The compiled library, from the cache when this source was built here before."""
    source = SOURCE.read_bytes()
    parts = [source, compiler.encode(), " ".join(_COMPILE_FLAGS).encode(), _cpu_identity().encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    target = _cache_dir() / f"decode_step-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("native_decode.compiling", source=str(SOURCE), target=str(target))
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run(
            [compiler, *_COMPILE_FLAGS, "-o", str(built), str(SOURCE), "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        os.replace(built, target)  # atomic: concurrent builders each write a whole file
    return target


@functools.cache
def load_library() -> ctypes.CDLL | None:
    """The native decode library, or None (disabled, no compiler, or the build failed)."""
    if os.environ.get(DISABLE_ENV, "").strip().lower() in {"0", "false", "off", "no"}:
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("native_decode.unavailable", reason="no C compiler on PATH")
        return None
    try:
        library = ctypes.CDLL(str(_build(compiler)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # RuntimeError: no home
        detail = getattr(exc, "stderr", None) or str(exc)
        log.warning("native_decode.unavailable", reason=str(detail)[-2000:])
        return None
    library.bastion_packed_layout.restype = ctypes.c_int
    library.bastion_packed_layout.argtypes = [_int64, _int64, _int64]
    function = library.bastion_decode_step
    function.restype = ctypes.c_int
    function.argtypes = [
        ctypes.POINTER(_Model),
        _int64,
        _ptr,
        _ptr,
        _ptr,
        _int64,
        _ptr,
        ctypes.c_int,
    ]
    return library


@dataclass(frozen=True, slots=True)
class _Int8Weights:
    """An Int8Linear's weights as the kernel reads them (float32 scales and bias)."""

    weight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None
    group: int

    @classmethod
    def of(cls, linear: Any, library: ctypes.CDLL) -> _Int8Weights:
        """The kernel's copy of `linear`'s weights, packed tile by tile where it reads them
        so: 4 rows by 32 features at a time, each tile one sequential stream."""
        assert isinstance(linear, Int8Linear)
        weight, group = linear.quantized, linear.group
        out, features = weight.shape
        if library.bastion_packed_layout(out, features, group):
            tiles = weight.view(out // _TILE_ROWS, _TILE_ROWS, features // _TILE_DEPTH, _TILE_DEPTH)
            weight = tiles.permute(0, 2, 1, 3).contiguous().view(out, features)
        bias = None if linear.bias is None else linear.bias.float().contiguous()
        return cls(weight, linear.scales.float().contiguous(), bias, group)

    def struct(self) -> _Projection:
        out, features = self.weight.shape
        return _Projection(
            self.weight.data_ptr(),
            self.scale.data_ptr(),
            None if self.bias is None else self.bias.data_ptr(),
            out,
            features,
            self.group,
        )


def supports(model: Any, kv_dtype: torch.dtype) -> bool:
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

    def __init__(
        self, library: ctypes.CDLL, model: Any, kv_cache: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        shape = model.shape
        self._function = library.bastion_decode_step
        self.vocab_size = shape.vocab_size
        float_ = torch.float32

        def f32(t: torch.Tensor) -> torch.Tensor:
            return t.to(float_).contiguous()

        # Everything the struct points to must outlive it: keep a reference to each tensor.
        self._keep: list[Any] = []
        layers = (_Layer * shape.num_layers)()
        for struct, layer, (k_cache, v_cache) in zip(layers, model.layers, kv_cache, strict=True):
            norms = (f32(layer.input_norm), f32(layer.post_norm))
            linears = (layer.qkv, layer.o, layer.gate_up, layer.down)
            projections = [_Int8Weights.of(p, library) for p in linears]
            self._keep += [*norms, *projections]
            struct.input_norm, struct.post_norm = (n.data_ptr() for n in norms)
            struct.qkv, struct.o, struct.gate_up, struct.down = (p.struct() for p in projections)
            struct.k_cache, struct.v_cache = k_cache.data_ptr(), v_cache.data_ptr()
        cos, sin, final_norm = f32(model.cos), f32(model.sin), f32(model.final_norm)
        lm_head = _Int8Weights.of(model.lm_head, library)
        intermediate = model.layers[0].down.quantized.shape[1]
        self._keep += [cos, sin, final_norm, lm_head, layers]
        self._model = _Model(
            num_layers=shape.num_layers,
            hidden=shape.hidden_size,
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            intermediate=intermediate,
            num_slots=kv_cache[0][0].shape[1],
            kv_bf16=int(kv_cache[0][0].dtype == torch.bfloat16),
            eps=model.eps,
            cos=cos.data_ptr(),
            sin=sin.data_ptr(),
            final_norm=final_norm.data_ptr(),
            lm_head=lm_head.struct(),
            layers=layers,
        )

    def step(
        self,
        embeddings: torch.Tensor,
        positions: torch.Tensor,
        context_slots: torch.Tensor,
        threads: int,
    ) -> torch.Tensor:
        """Float32 logits `[batch, vocab]` of one new token per sequence, after writing each
        token's K/V. `context_slots[b, :positions[b] + 1]` are row b's slots, its new
        token's last."""
        batch = embeddings.shape[0]
        hidden = embeddings.to(torch.float32, copy=True).contiguous()  # the kernel writes it
        positions = positions.to(torch.int64).contiguous()
        slots = context_slots.to(torch.int64).contiguous()
        logits = torch.empty(batch, self.vocab_size, dtype=torch.float32)
        status = self._function(
            ctypes.byref(self._model),
            batch,
            hidden.data_ptr(),
            positions.data_ptr(),
            slots.data_ptr(),
            slots.shape[1],
            logits.data_ptr(),
            threads,
        )
        if status != 0:
            raise MemoryError("native decode step could not allocate its scratch buffers")
        return logits
