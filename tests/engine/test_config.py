"""Engine settings: the KV budget from the environment, validation, pool sizing."""

from __future__ import annotations

import pytest
from transformers import LlamaForCausalLM

from engine.config import KV_CACHE_ENV, EngineConfig, kv_cache_mb_from_env
from engine.model_runner import kv_bytes_per_block
from tests.engine.conftest import make_core


def test_kv_budget_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KV_CACHE_ENV, raising=False)
    assert kv_cache_mb_from_env(64) == 64
    monkeypatch.setenv(KV_CACHE_ENV, "256")
    assert kv_cache_mb_from_env() == 256
    monkeypatch.setenv(KV_CACHE_ENV, "lots")
    with pytest.raises(ValueError, match=KV_CACHE_ENV):
        kv_cache_mb_from_env()


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="power of two"):
        EngineConfig(block_size=12)
    with pytest.raises(ValueError, match="max_batched_tokens"):
        EngineConfig(max_num_seqs=64, max_batched_tokens=32)
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(dtype="int8")


def test_the_pool_fills_the_budget(tiny_model: LlamaForCausalLM) -> None:
    core = make_core(tiny_model, kv_cache_mb=2)
    per_block = kv_bytes_per_block(core.runner.model.shape, 16, core.runner.model.dtype)
    assert core.blocks.num_blocks == 2 * 1024 * 1024 // per_block
    assert core.metrics().kv_blocks_free == core.blocks.num_blocks
