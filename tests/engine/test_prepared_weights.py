"""Int8 weights prepared once and kept between starts (engine/prepared_weights.py): what
reads back is what was prepared, another model file or dtype gets its own copy, a damaged
copy is prepared again, and the served engine answers the same either way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch

from engine import (
    EngineConfig,
    PagedEngine,
    SamplingParams,
    default_model_source,
    gguf_model,
    resolve_engine_config,
)
from engine import prepared_weights as prepared
from engine.core import EngineCore
from engine.gguf_file import GGUFFile
from engine.gguf_model import load_gguf_model
from engine.linear import Int8Linear, Linear
from engine.llama import LlamaWeights, PagedLlama
from engine.model_runner import ModelRunner
from tests.engine.conftest import needs_compiler, random_prompt, run_core, tiny_llama, token_ids

CPU = torch.device("cpu")


def int8_model(seed: int = 3) -> tuple[PagedLlama, object]:
    hf = tiny_llama(seed=seed, tie_word_embeddings=True)
    return PagedLlama.from_hf(hf, CPU, torch.bfloat16, "int8"), hf.config


def linear_tensors(linear: Linear) -> list[torch.Tensor | None]:
    assert isinstance(linear, Int8Linear)
    return [linear.quantized, linear.scales, linear.dense, linear.bias, linear.kernel_scales]


def all_tensors(weights: LlamaWeights) -> list[torch.Tensor | None]:
    tensors = [weights.embed, weights.final_norm, *linear_tensors(weights.lm_head)]
    for layer in weights.layers:
        tensors += [layer.input_norm, layer.post_norm]
        for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
            tensors += linear_tensors(linear)
    return tensors


def test_saved_weights_read_back_as_prepared(tmp_path: Path) -> None:
    model, config = int8_model()
    path = tmp_path / "weights.pt"
    prepared.save(model.weights(), path)
    loaded = prepared.load(path, torch.bfloat16)
    assert loaded is not None
    for ours, theirs in zip(all_tensors(loaded), all_tensors(model.weights()), strict=True):
        if theirs is None:
            assert ours is None
        else:
            assert ours is not None and ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    # The tied embedding stays the output projection's dense twin: one table, not two, and
    # neither is in the file (the twin is dequantized again).
    assert isinstance(loaded.lm_head, Int8Linear)
    assert loaded.embed.data_ptr() == loaded.lm_head.dense.data_ptr()
    saved = torch.load(path, weights_only=True)["tensors"]
    assert "embed" not in saved and not any(name.endswith(".dense") for name in saved)
    restored = PagedLlama(config, loaded, CPU, torch.bfloat16)
    assert torch.equal(restored.cos, model.cos) and restored.shape == model.shape


def test_a_restored_model_decodes_as_the_prepared_one(tmp_path: Path) -> None:
    model, config = int8_model(seed=5)
    path = tmp_path / "weights.pt"
    prepared.save(model.weights(), path)
    loaded = prepared.load(path, torch.bfloat16)
    assert loaded is not None
    engine_config = resolve_engine_config(EngineConfig(weights="int8", kv_cache_mb=4), "cpu")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    generated = []
    for paged in (model, PagedLlama(config, loaded, CPU, torch.bfloat16)):
        core = EngineCore(
            ModelRunner.from_config(paged, engine_config), engine_config, "t", frozenset()
        )
        for n, prompt in enumerate((random_prompt(20, seed=1), random_prompt(7, seed=2))):
            core.add_request(f"r{n}", prompt, params)
        generated.append(run_core(core))
    assert generated[0] == generated[1]
    assert sorted(len(ids) for ids in generated[0].values()) == [12, 12]


def test_tiled_or_packed_weights_are_not_saved(tmp_path: Path) -> None:
    model, _ = int8_model()
    model.layers[0].down.tiles(4, 16)  # type: ignore[union-attr]  # grouped: tiled in place
    with pytest.raises(prepared.UnpreparedWeights, match="tiled"):
        prepared.save(model.weights(), tmp_path / "weights.pt")
    float_model = PagedLlama.from_hf(tiny_llama(seed=3), CPU, torch.float32, "float")
    with pytest.raises(prepared.UnpreparedWeights, match="DenseLinear"):
        prepared.save(float_model.weights(), tmp_path / "weights.pt")
    assert not list(tmp_path.iterdir())  # nothing half-written is left


def test_the_key_outlives_an_image_layer_that_keeps_whole_seconds(tmp_path: Path) -> None:
    """A container image's layers are tar archives: a file's modification time comes out of
    them in whole seconds, and the copy `bastion prepare` saved at build must still be read."""
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"GGUF one")
    os.utime(model_file, ns=(1_796_647_156_123_456_789, 1_796_647_156_123_456_789))
    at_build = prepared.prepared_path(tmp_path, model_file, torch.bfloat16)
    os.utime(model_file, ns=(1_796_647_156_000_000_000, 1_796_647_156_000_000_000))
    assert prepared.prepared_path(tmp_path, model_file, torch.bfloat16) == at_build
    os.utime(model_file, ns=(1_796_647_157_000_000_000, 1_796_647_157_000_000_000))
    assert prepared.prepared_path(tmp_path, model_file, torch.bfloat16) != at_build


def test_each_model_file_and_dtype_has_its_own_copy(tmp_path: Path) -> None:
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"GGUF one")
    first = prepared.prepared_path(tmp_path, model_file, torch.bfloat16)
    assert prepared.prepared_path(tmp_path, model_file, torch.bfloat16) == first
    assert prepared.prepared_path(tmp_path, model_file, torch.float32) != first
    other_folder = tmp_path / "other"
    other_folder.mkdir()
    (other_folder / "model.gguf").write_bytes(b"GGUF one")
    elsewhere = prepared.prepared_path(tmp_path, other_folder / "model.gguf", torch.bfloat16)
    assert elsewhere != first
    model_file.write_bytes(b"GGUF two, replaced")
    os.utime(model_file, ns=(1, 1))
    replaced = prepared.prepared_path(tmp_path, model_file, torch.bfloat16)
    assert replaced != first

    # Saving the replaced file's copy removes the stale one, and only that one.
    weights = int8_model()[0].weights()
    for path in (first, elsewhere):
        prepared.save(weights, path)
    prepared.save(weights, replaced)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == sorted([replaced.name, elsewhere.name])


def test_a_damaged_copy_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    prepared.save(int8_model()[0].weights(), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert prepared.load(path, torch.bfloat16) is None
    assert prepared.load(tmp_path / "missing.pt", torch.bfloat16) is None


@needs_compiler
def test_the_second_start_reads_the_weights_the_first_prepared(tmp_path: Path) -> None:
    """`PagedEngine.load` on SmolLM2's GGUF: the first load prepares and saves, the second
    reads the copy, and both answer with the same greedy tokens through the native step."""
    source = default_model_source()
    config = EngineConfig(weights="auto", kv_cache_mb=32, num_threads=1, native_cache_dir=tmp_path)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    prompts = [[1, 9690, 314, 253, 1345, 28, 4134, 198], [504, 3458, 282, 4944, 314, 216]]
    answers = []
    for start in ("prepares", "reads"):
        engine = PagedEngine.load(source, device="cpu", config=config)
        try:
            assert engine._core.runner.native is not None, start
            answers.append([token_ids(outs) for outs in engine.generate(prompts, params)])
        finally:
            engine.close()
        saved = list(tmp_path.glob("weights-*.pt"))
        assert len(saved) == 1, start
        if start == "prepares":
            first_save = saved[0].stat().st_mtime_ns
    assert saved[0].stat().st_mtime_ns == first_save  # read, not written again
    assert answers[0] == answers[1]
    assert [len(ids) for ids in answers[0]] == [16, 16]


def test_a_damaged_copy_is_prepared_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """...from the GGUF read at full precision, as every int8 model is quantized."""
    requested: list[torch.dtype] = []

    def recording(gguf: GGUFFile, dtype: torch.dtype) -> tuple[Any, Any]:
        requested.append(dtype)
        return load_gguf_model(gguf, dtype)

    monkeypatch.setattr(gguf_model, "load_gguf_model", recording)
    source = default_model_source()
    assert source.gguf_file is not None
    config = EngineConfig(
        weights="int8",
        kv_cache_mb=16,
        num_threads=1,
        native_decode=False,
        native_cache_dir=tmp_path,
    )
    dtype = config.torch_dtype("cpu")
    path = prepared.prepared_path(tmp_path, source.folder / source.gguf_file, dtype)
    path.write_bytes(b"not a torch file")
    engine = PagedEngine.load(source, device="cpu", config=config)
    engine.close()
    assert prepared.load(path, dtype) is not None
    assert requested == [torch.float32]


def test_a_cache_that_cannot_be_written_only_costs_the_time(tmp_path: Path) -> None:
    """A start whose cache folder cannot be made (here a file stands in its place) serves
    all the same, and says why the weights were not kept."""
    blocked = tmp_path / "cache"
    blocked.write_text("a file, not a folder")
    config = EngineConfig(
        weights="int8", kv_cache_mb=16, native_decode=False, native_cache_dir=blocked
    )
    with structlog.testing.capture_logs() as logs:
        engine = PagedEngine.load(default_model_source(), device="cpu", config=config)
    try:
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        (outs,) = engine.generate([[1, 9690, 314, 253]], params)
        assert len(token_ids(outs)) == 4
    finally:
        engine.close()
    (warning,) = [log for log in logs if log["event"] == "engine.prepared_weights_not_saved"]
    assert warning["log_level"] == "warning" and str(blocked) in warning["path"]
    assert blocked.read_text() == "a file, not a folder"
