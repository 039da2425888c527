"""The paged KV cache's memory: one K and one V tensor per layer, allocated once.

Each layer's pool holds slots per K/V head, `[kv_heads, num_blocks * block_size,
head_dim]`; slot `block * block_size + offset` holds one token. Head-major, so that
gathering a batch's slots gives each head's keys contiguous (engine/attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.config import EngineConfig
from engine.types import EngineError


@dataclass(frozen=True, slots=True)
class KVLayout:
    """What a model's attention keeps per token: K and V of `num_kv_heads` heads of
    `head_dim` features in each of `num_layers` layers, in `dtype`."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_block(self, block_size: int) -> int:
        element = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * element


@dataclass(frozen=True, slots=True)
class LayerKV:
    """One layer's K and V pools, `[kv_heads, slots, head_dim]` each."""

    keys: torch.Tensor
    values: torch.Tensor

    def store(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the K/V of a step's tokens (`[tokens, kv_heads, head_dim]`) into `slots`."""
        self.keys.index_copy_(1, slots, k.transpose(0, 1))
        self.values.index_copy_(1, slots, v.transpose(0, 1))


@dataclass(frozen=True, slots=True)
class KVPool:
    """Every layer's K/V pool, `block_size` slots a block."""

    layout: KVLayout
    block_size: int
    layers: tuple[LayerKV, ...]

    @classmethod
    def allocate(
        cls, layout: KVLayout, num_blocks: int, block_size: int, device: torch.device
    ) -> KVPool:
        """A zeroed pool of `num_blocks` blocks."""
        dims = (layout.num_kv_heads, num_blocks * block_size, layout.head_dim)
        layers = tuple(
            LayerKV(_zeros(dims, layout.dtype, device), _zeros(dims, layout.dtype, device))
            for _ in range(layout.num_layers)
        )
        return cls(layout, block_size, layers)

    @classmethod
    def for_config(cls, layout: KVLayout, config: EngineConfig, device: torch.device) -> KVPool:
        """A pool that fills `config.kv_cache_mb` (or holds `config.num_kv_blocks`)."""
        block_size, kv_cache_mb = config.block_size, config.kv_cache_mb
        per_block = layout.bytes_per_block(block_size)
        num_blocks = config.num_kv_blocks or kv_cache_mb * 1024 * 1024 // per_block
        if num_blocks < 2:
            raise EngineError(
                f"a KV cache of {kv_cache_mb} MiB holds fewer than 2 blocks of {block_size} "
                f"tokens ({per_block} bytes each): raise kv_cache_mb"
            )
        return cls.allocate(layout, num_blocks, block_size, device)

    @property
    def num_slots(self) -> int:
        return self.layers[0].keys.shape[1]

    @property
    def num_blocks(self) -> int:
        return self.num_slots // self.block_size

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype


_ALIGNMENT = 64  # bytes: what PyTorch's CPU allocator gives, and the native step's vectors


def _zeros(dims: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros that take memory only as they are written, on the CPU: `torch.zeros` writes
    every page at once (a pool of 512 MiB is resident from start-up, before any request),
    while calloc's fresh pages read as zero until first written. Other devices: zeros."""
    if device.type != "cpu":
        return torch.zeros(dims, dtype=dtype, device=device)
    element = torch.tensor([], dtype=dtype).element_size()
    size = dims[0] * dims[1] * dims[2] * element
    raw = torch.from_numpy(np.zeros(size + _ALIGNMENT, dtype=np.uint8))
    start = -raw.data_ptr() % _ALIGNMENT
    return raw[start : start + size].view(dtype).view(dims)
