"""The embedded engine's int8 weights in their serving form, kept between starts.

Preparing them from SmolLM2's GGUF is the longest stage of a cold start: the Q4_1 blocks
dequantized to float32, a transformers model built around them, then every projection
quantized again to int8 groups (about 1.3 s of CPU on 2 cores, docs/benchmarks.md "Cold
start"). The int8 groups and their scales depend only on the file and the code that
prepares them, so the first start saves them beside the native decode step's build (the
same cache folder) and later starts read them back and dequantize the dense twin that
prefill uses. `bastion prepare` saves them into a container image.

The file's name holds a key over the GGUF's path, size and modification time (in whole
seconds, as a container image's layers keep it), the dtype,
PyTorch's version and the bytes of the modules that shape the values, so an edit to any of
them, or another file under the same path, is never served from a stale copy. A file
that does not read back is prepared again and replaced.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch

from engine.config import EngineConfig
from engine.linear import Int8Linear, Linear, dequantize_int8_groups
from engine.llama import LayerWeights, LlamaWeights, PagedLlama
from engine.model_source import ModelSource
from engine.native_library import default_cache_dir

log = structlog.get_logger(__name__)

_ENGINE_DIR = Path(__file__).parent
# The modules whose code decides the saved values.
_PREPARING_MODULES = (
    "gguf_file.py",
    "gguf_model.py",
    "linear.py",
    "llama.py",
    "prepared_weights.py",
)
KEY_LENGTH = 16
_LAYER_TENSORS = ("input_norm", "post_norm")
_LAYER_LINEARS = ("qkv", "o", "gate_up", "down")
# The dense twin is computed again from these: a fifth of the file, and faster than reading
# it (0.06 s to read and 0.22 s to dequantize SmolLM2, against 0.6 s to read it whole).
_INT8_FIELDS = ("quantized", "scales", "bias", "kernel_scales")


@dataclass(frozen=True, slots=True)
class PreparedModel:
    """A model ready to serve, and where its weights are kept."""

    model: PagedLlama
    tokenizer: Any
    generation_config: Any
    path: Path
    read: bool  # whether the weights were read from `path` (else prepared now)


def load_prepared(
    source: ModelSource, device: torch.device, config: EngineConfig
) -> PreparedModel | None:
    """A GGUF's int8 model on a CPU, its weights read from the cache where an earlier start
    prepared them, else prepared and saved there (in `config.native_cache_dir`). None for
    other models, formats and devices, which are prepared at every start."""
    from transformers import GenerationConfig

    from engine.gguf_file import GGUFFile
    from engine.gguf_model import is_direct, load_gguf_config, load_gguf_model

    if source.gguf_file is None or device.type != "cpu" or config.weight_format != "int8":
        return None
    gguf = GGUFFile.open(source.folder / source.gguf_file)
    if not is_direct(gguf):
        return None
    dtype = config.torch_dtype(device.type)
    path = prepared_path(config.native_cache_dir or default_cache_dir(), gguf.path, dtype)
    weights = load(path, dtype)
    if weights is not None:
        hf_config, tokenizer = load_gguf_config(gguf)
        model = PagedLlama(hf_config, weights, device, dtype)
        generation_config = GenerationConfig.from_model_config(hf_config)
    else:
        # Quantized from full precision, as every int8 model is.
        hf_model, tokenizer = load_gguf_model(gguf, torch.float32)
        model = PagedLlama.from_hf(hf_model, device, dtype, "int8")
        generation_config = hf_model.generation_config
        del hf_model  # its float32 weights, before the copy is written
        _save_for_next_start(model, path)
    log.info("engine.prepared_weights", path=str(path), read=weights is not None)
    return PreparedModel(model, tokenizer, generation_config, path, weights is not None)


def _save_for_next_start(model: PagedLlama, path: Path) -> None:
    """A cache that cannot be written (a read-only file system) only costs the next start
    the time again."""
    try:
        save(model.weights(), path)
    except (OSError, RuntimeError) as error:  # torch's file writer raises RuntimeError
        log.warning("engine.prepared_weights_not_saved", path=str(path), error=str(error))


class UnpreparedWeights(ValueError):
    """Weights in a form this cache does not save: only row-major int8 projections are."""


def prepared_path(cache_dir: Path, model_file: Path, dtype: torch.dtype) -> Path:
    """Where the int8 weights prepared from `model_file` in `dtype` are kept."""
    model_file = model_file.resolve()
    stat = model_file.stat()
    parts = [
        str(model_file).encode(),
        str(stat.st_size).encode(),
        # Whole seconds: an image layer (a tar archive) keeps no more, so the copy
        # `bastion prepare` saved at image build would otherwise never be read.
        str(stat.st_mtime_ns // 1_000_000_000).encode(),
        str(dtype).encode(),
        torch.__version__.encode(),
        *((_ENGINE_DIR / name).read_bytes() for name in _PREPARING_MODULES),
    ]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:KEY_LENGTH]
    return cache_dir / f"{_prefix(model_file)}-{key}.pt"


def _prefix(model_file: Path) -> str:
    """The part of the name shared by every copy prepared from one model file."""
    where = hashlib.sha256(str(model_file).encode()).hexdigest()[:8]
    return f"weights-{model_file.stem}-{where}"


def save(weights: LlamaWeights, path: Path) -> None:
    """Write `weights` to `path` whole or not at all, replacing the copies prepared from the
    same model file by other code or settings."""
    tensors: dict[str, torch.Tensor] = {"final_norm": weights.final_norm}
    _put_linear("lm_head", weights.lm_head, tensors)
    # A tied embedding is the output projection's dense twin (engine/llama.py), and stays so.
    tied = isinstance(weights.lm_head, Int8Linear) and weights.embed is weights.lm_head.dense
    if not tied:
        tensors["embed"] = weights.embed
    for index, layer in enumerate(weights.layers):
        for name in _LAYER_TENSORS:
            tensors[f"layers.{index}.{name}"] = getattr(layer, name)
        for name in _LAYER_LINEARS:
            _put_linear(f"layers.{index}.{name}", getattr(layer, name), tensors)
    state = {"tensors": tensors, "num_layers": len(weights.layers)}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        torch.save(state, partial)  # one storage for tensors that share one (a tied embedding)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    prefix = path.name.rsplit("-", 1)[0]
    for older in path.parent.glob(f"{prefix}-{'?' * KEY_LENGTH}.pt"):
        if older != path:
            older.unlink(missing_ok=True)


def load(path: Path, dtype: torch.dtype) -> LlamaWeights | None:
    """The weights saved at `path`, computing in `dtype`; None where there are none or
    they do not read back."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        tensors = state["tensors"]
        layers = [
            LayerWeights(
                input_norm=tensors[f"layers.{i}.input_norm"],
                qkv=_take_linear(f"layers.{i}.qkv", tensors, dtype),
                o=_take_linear(f"layers.{i}.o", tensors, dtype),
                post_norm=tensors[f"layers.{i}.post_norm"],
                gate_up=_take_linear(f"layers.{i}.gate_up", tensors, dtype),
                down=_take_linear(f"layers.{i}.down", tensors, dtype),
            )
            for i in range(int(state["num_layers"]))
        ]
        lm_head = _take_linear("lm_head", tensors, dtype)
        embed = tensors.get("embed", lm_head.dense)
        return LlamaWeights(embed, tensors["final_norm"], lm_head, layers)
    except Exception as error:  # a damaged or foreign file is prepared again, never served
        log.warning("engine.prepared_weights_unreadable", path=str(path), error=str(error))
        return None


def _put_linear(name: str, linear: Linear, tensors: dict[str, torch.Tensor]) -> None:
    if not isinstance(linear, Int8Linear):
        raise UnpreparedWeights(f"{name}: {type(linear).__name__} is not saved")
    if linear.tiled:  # the tile shape is the native library's: not part of the key
        raise UnpreparedWeights(f"{name}: tiled for a native step; save before tiling")
    for field in _INT8_FIELDS:
        value = getattr(linear, field)
        if value is not None:
            tensors[f"{name}.{field}"] = value


def _take_linear(name: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> Int8Linear:
    quantized, scales = tensors[f"{name}.quantized"], tensors[f"{name}.scales"]
    dense = dequantize_int8_groups(quantized, scales, dtype)
    bias, kernel_scales = tensors.get(f"{name}.bias"), tensors.get(f"{name}.kernel_scales")
    return Int8Linear(quantized, scales, dense, bias, kernel_scales)
