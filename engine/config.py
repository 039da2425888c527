"""Settings of the paged engine: memory budget, block size, batch limits, weights.

The engine reads no environment variable: the gateway reads its settings once and passes
an `EngineConfig` down.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

import torch

from engine.cpu_info import cpu_has_bf16
from engine.linear import WeightFormat, fbgemm_supported
from engine.native_library import load_library

_DTYPES = frozenset({"float32", "bfloat16", "float16"})
DEFAULT_KV_CACHE_MB = 512

# A weight format, or "auto": the fastest faithful one for the device
# (`resolve_engine_config`).
WeightChoice = Literal["auto", WeightFormat]
WEIGHT_CHOICES: tuple[WeightChoice, ...] = get_args(WeightChoice)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine spends memory and compute.

    `max_batched_tokens` is the per-step token budget shared by decodes (one token each)
    and prefill chunks; `max_waiting` bounds the queue of requests not yet running.
    """

    kv_cache_mb: int = DEFAULT_KV_CACHE_MB
    block_size: int = 16
    # On 2 cores a decode step is compute bound beyond a few rows, so more answers at once
    # cost each one time per token but not throughput: with 64 streaming clients, 64 at
    # once against 32 took the median time to the first token from 5.8 to 3.3 s, at 9.05
    # requests/s against 8.10 (docs/benchmarks.md, "Load").
    max_num_seqs: int = 64
    max_batched_tokens: int = 512
    max_waiting: int = 128
    enable_prefix_caching: bool = True
    num_kv_blocks: int | None = None  # overrides the budget: for tests and tuning
    # Intra-op threads of the engine thread (None: `threads_for`'s default). On a CPU shared
    # with other processes, fewer threads than cores keeps OpenMP threads from spinning
    # against them.
    num_threads: int | None = None
    dtype: str | None = None  # "float32", "bfloat16", "float16"; None: see torch_dtype
    # The projections' weight format (engine/linear.py): the compact ones trade a measured
    # bit of fidelity (docs/benchmarks.md) for faster decoding where memory bandwidth bounds it.
    weights: WeightChoice = "float"
    # The native decode step (engine/native_decode.py): whether to use it, and where its
    # compiled library is cached (None: $XDG_CACHE_HOME or ~/.cache, then bastion/native).
    native_decode: bool = True
    native_cache_dir: Path | None = None
    # Speculative decoding (engine/speculative.py): the longest prompt-lookup draft a
    # decoding sequence verifies in one step (0: off), and the most running sequences for
    # which drafts are proposed at all. On 2 cores a native int8 step of SmolLM2 costs
    # about the same for 1 or 2 rows, 1.6x for 4 and 3.5x for 8 (its matmuls turn compute
    # bound): beyond a couple of sequences, verification costs more than it saves.
    speculative_tokens: int = 0
    speculative_max_batch: int = 2

    def __post_init__(self) -> None:
        if self.kv_cache_mb <= 0:
            raise ValueError("kv_cache_mb must be positive")
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a positive power of two")
        if self.max_num_seqs <= 0:
            raise ValueError("max_num_seqs must be positive")
        if self.max_batched_tokens < self.max_num_seqs:
            raise ValueError("max_batched_tokens must be >= max_num_seqs (one token per decode)")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be positive")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("num_threads must be positive")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.weights not in WEIGHT_CHOICES:
            raise ValueError(f"weights must be one of {list(WEIGHT_CHOICES)}, got {self.weights!r}")
        if self.max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        if self.speculative_tokens < 0 or self.speculative_max_batch < 0:
            raise ValueError("speculative_tokens and speculative_max_batch must be >= 0")

    @property
    def weight_format(self) -> WeightFormat:
        """The concrete weight format; "auto" must be resolved first."""
        if self.weights == "auto":
            raise ValueError("weights='auto' is resolved by resolve_engine_config(config, device)")
        return self.weights

    def torch_dtype(self, device_type: str) -> torch.dtype:
        """The activations' and KV cache's dtype on a device of this type."""
        if self.dtype is not None:
            dtype: torch.dtype = getattr(torch, self.dtype)
            return dtype
        # PyTorch's int8 weight kernel is fast with bf16 activations, slow with fp32 ones;
        # under w8a8, bf16 keeps the KV cache and attention as small. Without native bf16
        # instructions a 400-token prefill of SmolLM2 took 3.5x as long in bf16 as in
        # float32 (a 2-core AVX2 EPYC).
        if device_type == "cuda":
            return torch.bfloat16
        if self.weight_format != "float" and cpu_has_bf16():
            return torch.bfloat16
        return torch.float32

    def threads_for(self, device_type: str) -> int | None:
        """Intra-op threads for the engine thread's larger steps (`ModelRunner`): on CPU,
        every core by default.

        Alone on 2 cores, the second thread made 16 decodes 1.2-1.6x faster and the first
        token after a shared 800-token prefix 1.4-1.9x sooner; under 16 streaming clients
        through the whole gateway (its guardrail models on one thread of their own),
        throughput and time to first token were the same as with half the cores
        (bench/engine.py, bench/load.py; docs/benchmarks.md).
        """
        if self.num_threads is not None or device_type != "cpu":
            return self.num_threads
        return os.cpu_count() or 1


def resolve_engine_config(config: EngineConfig, device: str) -> EngineConfig:
    """`config` with concrete weights for a device of type `device` ("cpu", "cuda").

    "auto" is float off the CPU; on a CPU, int8 where the native decode step builds (as
    faithful as fp16 and about 3x faster, docs/benchmarks.md), else fp16 where fbgemm runs
    it, else int8 on PyTorch's kernels.
    """
    if config.weights != "auto":
        return config
    weights: WeightFormat
    if device != "cpu":
        weights = "float"
    elif load_library(config.native_decode, config.native_cache_dir) is not None:
        weights = "int8"
    else:
        weights = "fp16" if fbgemm_supported() else "int8"
    return replace(config, weights=weights)
