"""Engine settings: validation, "auto" weights resolved for the device, pool sizing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

import engine.config
import engine.cpu_info
from engine import EngineConfig, PagedEngine, WeightChoice, resolve_engine_config
from engine.linear import fbgemm_supported
from engine.native_library import load_library
from tests.engine.conftest import make_core


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="power of two"):
        EngineConfig(block_size=12)
    with pytest.raises(ValueError, match="max_batched_tokens"):
        EngineConfig(max_num_seqs=64, max_batched_tokens=32)
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(dtype="int8")
    with pytest.raises(ValueError, match="weights"):
        EngineConfig(weights="int4")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("weights", "device", "expected"),
    [
        ("auto", "cpu", "int8" if load_library() or not fbgemm_supported() else "fp16"),
        ("auto", "cuda", "float"),
        ("float", "cpu", "float"),
        ("int8", "cuda", "int8"),
        ("w8a8", "cpu", "w8a8"),
    ],
)
def test_weights_choice_and_device(weights: WeightChoice, device: str, expected: str) -> None:
    config = resolve_engine_config(EngineConfig(weights=weights, kv_cache_mb=96), device)
    assert config.weights == expected
    assert config.kv_cache_mb == 96


def test_auto_weights_fall_back_to_fp16_without_the_native_step(tmp_path: Path) -> None:
    expected = "fp16" if fbgemm_supported() else "int8"
    disabled = EngineConfig(weights="auto", native_decode=False)
    assert resolve_engine_config(disabled, "cpu").weights == expected
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    unbuildable = EngineConfig(weights="auto", native_cache_dir=not_a_folder / "cache")
    assert resolve_engine_config(unbuildable, "cpu").weights == expected


def test_auto_weights_must_be_resolved_before_use() -> None:
    with pytest.raises(ValueError, match="resolve_engine_config"):
        EngineConfig(weights="auto").torch_dtype("cpu")


@pytest.mark.parametrize("native_bf16", [True, False])
def test_quantized_weights_take_bf16_activations_only_where_the_cpu_has_bf16(
    monkeypatch: pytest.MonkeyPatch, native_bf16: bool
) -> None:
    monkeypatch.setattr(engine.config, "cpu_has_bf16", lambda: native_bf16)
    expected = torch.bfloat16 if native_bf16 else torch.float32
    assert EngineConfig(weights="int8").torch_dtype("cpu") == expected
    assert EngineConfig(weights="float").torch_dtype("cpu") == torch.float32
    assert EngineConfig(weights="int8").torch_dtype("cuda") == torch.bfloat16
    assert EngineConfig(weights="int8", dtype="bfloat16").torch_dtype("cpu") == torch.bfloat16


def test_only_native_bf16_flags_count(monkeypatch: pytest.MonkeyPatch) -> None:
    avx512 = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
    monkeypatch.setattr(engine.cpu_info, "cpuinfo", lambda: avx512)
    assert not engine.cpu_info.cpu_has_bf16()
    monkeypatch.setattr(engine.cpu_info, "cpuinfo", lambda: avx512.replace("vnni", "bf16"))
    assert engine.cpu_info.cpu_has_bf16()
    monkeypatch.setattr(engine.cpu_info, "cpuinfo", lambda: "")  # not Linux
    assert not engine.cpu_info.cpu_has_bf16()


def test_the_engine_resolves_auto_weights_itself(
    make_engine: Callable[..., PagedEngine],
) -> None:
    engine = make_engine(weights="auto", native_decode=False)
    expected = "fp16" if fbgemm_supported() else "int8"
    assert engine.call(lambda core: core.config.weights) == expected


def test_the_pool_fills_the_budget(tiny_model: LlamaForCausalLM) -> None:
    core = make_core(tiny_model, kv_cache_mb=2)
    pool = core.runner.pool
    per_block = pool.layout.bytes_per_block(16)
    assert core.blocks.num_blocks == pool.num_blocks == 2 * 1024 * 1024 // per_block
    allocated = sum(t.nbytes for layer in pool.layers for t in (layer.keys, layer.values))
    assert allocated == pool.num_blocks * per_block
    assert core.metrics().kv_blocks_free == core.blocks.num_blocks
