"""A GGUF file's metadata and tensors, read straight from a memory map.

gguf-py's `GGUFReader` builds a numpy view for every part of every field: on SmolLM2's
98,000 vocabulary strings and merges that takes 7-12 s, and transformers opens the file
four times to load one model. Here strings are decoded once with `struct`, numeric
arrays are one `frombuffer` each, and tensors stay views of the map until dequantized
(with gguf-py's own `dequantize`, so the values are the ones transformers computes).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize
from gguf.quants import quant_shape_to_byte_shape

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# GGUF's value types (gguf.GGUFValueType): scalars by struct format.
_SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?"}
_SCALARS.update({10: "Q", 11: "q", 12: "d"})
_NUMPY: dict[int, str] = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4"}
_NUMPY.update({7: "?", 10: "<u8", 11: "<i8", 12: "<f8"})
_STRING, _ARRAY = 8, 9
# Unquantized tensor types: numpy dtypes of their elements.
_PLAIN_TENSORS: dict[GGMLQuantizationType, str] = {
    GGMLQuantizationType.F32: "<f4",
    GGMLQuantizationType.F16: "<f2",
    GGMLQuantizationType.F64: "<f8",
    GGMLQuantizationType.I8: "i1",
    GGMLQuantizationType.I16: "<i2",
    GGMLQuantizationType.I32: "<i4",
    GGMLQuantizationType.I64: "<i8",
}

MetadataValue = int | float | bool | str | list["MetadataValue"]


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor: `raw` as gguf-py shapes it (rows of bytes for quantized types)."""

    name: str
    kind: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: the GGUF dims reversed
    raw: npt.NDArray[np.generic]

    def to_numpy(self) -> npt.NDArray[np.float32]:
        """The values in float32 (dequantized where the type is quantized), by gguf-py."""
        values = dequantize(self.raw, self.kind)
        return np.asarray(values, dtype=np.float32).reshape(self.shape)

    def to_tensor(self) -> torch.Tensor:
        """The values as a new float32 tensor, equal to `to_numpy()`'s.

        Q4_1 and Q8_0 (SmolLM2's) are dequantized by torch over the whole tensor, on every
        core, with gguf-py's operations in gguf-py's order (so the same roundings); other
        types by gguf-py.
        """
        dequantize_blocks = _TORCH_DEQUANTIZERS.get(self.kind)
        if dequantize_blocks is None:
            return torch.from_numpy(np.array(self.to_numpy(), dtype=np.float32))
        blocks = torch.from_numpy(self.raw).view(-1, GGML_QUANT_SIZES[self.kind][1])
        return dequantize_blocks(blocks).view(self.shape)


def _half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte `start` of each block, as float32 `[blocks, 1]`."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """gguf-py's Q4_1: scale d, minimum m, then 32 nibbles (low halves first); d * q + m."""
    packed = blocks[:, 4:]
    nibbles = torch.cat((packed & 0x0F, packed >> 4), dim=1).float()
    return (_half(blocks, 0) * nibbles) + _half(blocks, 2)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    """gguf-py's Q8_0: scale d, then 32 int8 values; q * d."""
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _half(blocks, 0)


_TORCH_DEQUANTIZERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q8_0: _q8_0,
}


class _Cursor:
    """Little-endian reads from a buffer, advancing an offset."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.offset = 0

    def scalar(self, fmt: str) -> int | float | bool:
        (value,) = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value  # type: ignore[no-any-return]

    def string(self) -> str:
        length = int(self.scalar("Q"))
        start = self.offset
        self.offset += length
        return self.buffer[start : self.offset].decode("utf-8")

    def value(self, kind: int) -> MetadataValue:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFFormatError(f"unknown GGUF value type {kind}")
        item_kind, count = int(self.scalar("I")), int(self.scalar("Q"))
        if item_kind in _NUMPY:
            dtype = np.dtype(_NUMPY[item_kind])
            items = np.frombuffer(self.buffer, dtype, count, self.offset)
            self.offset += dtype.itemsize * count
            return items.tolist()  # type: ignore[no-any-return]
        read: Callable[[], MetadataValue] = (
            self.string if item_kind == _STRING else lambda: self.value(item_kind)
        )
        return [read() for _ in range(count)]


@dataclass(frozen=True, slots=True)
class GGUFFile:
    """Metadata (key to value, arrays as lists) and tensors (in file order) of a GGUF file."""

    path: Path
    metadata: dict[str, MetadataValue]
    tensors: dict[str, GGUFTensor]

    @classmethod
    def open(cls, path: Path) -> GGUFFile:
        """Map `path`; tensors are views of the map, read when first used."""
        with path.open("rb") as file:
            # Copy-on-write: tensors can view it (torch wants writable memory); the file
            # is never written.
            buffer = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        cursor = _Cursor(buffer)
        if buffer[:4] != _MAGIC:
            raise GGUFFormatError(f"{path} is not a GGUF file")
        cursor.offset = 4
        version = int(cursor.scalar("I"))
        if version not in (2, 3):
            raise GGUFFormatError(f"{path}: GGUF version {version} is not supported")
        tensor_count, kv_count = int(cursor.scalar("Q")), int(cursor.scalar("Q"))
        metadata: dict[str, MetadataValue] = {}
        for _ in range(kv_count):
            key = cursor.string()
            metadata[key] = cursor.value(int(cursor.scalar("I")))
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = [int(cursor.scalar("Q")) for _ in range(int(cursor.scalar("I")))]
            kind = GGMLQuantizationType(int(cursor.scalar("I")))
            infos.append((name, dims, kind, int(cursor.scalar("Q"))))
        alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))  # type: ignore[arg-type]
        data_start = -(-cursor.offset // alignment) * alignment
        tensors = {
            name: _tensor(buffer, data_start + int(offset), name, dims, kind)
            for name, dims, kind, offset in infos
        }
        return cls(path, metadata, tensors)


def _tensor(
    buffer: mmap.mmap, offset: int, name: str, dims: list[int], kind: GGMLQuantizationType
) -> GGUFTensor:
    shape = tuple(reversed(dims))
    count = int(np.prod(dims))
    if kind in _PLAIN_TENSORS:
        raw = np.frombuffer(buffer, np.dtype(_PLAIN_TENSORS[kind]), count, offset).reshape(shape)
        return GGUFTensor(name, kind, shape, raw)
    block_size, type_size = GGML_QUANT_SIZES[kind]
    size = count * type_size // block_size
    raw = np.frombuffer(buffer, np.uint8, size, offset)
    return GGUFTensor(name, kind, shape, raw.reshape(quant_shape_to_byte_shape(shape, kind)))
