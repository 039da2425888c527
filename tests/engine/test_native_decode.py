"""The native decode step (engine/native/decode_step.c) against the PyTorch path."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import SamplingParams
from engine.kv_pool import KVPool
from engine.linear import Int8Linear
from engine.llama import PagedLlama
from engine.model_runner import NATIVE_CHUNK_MAX_TOKENS, ModelRunner
from engine.native_decode import NativeDecoder, PackShape
from engine.native_library import load_library
from engine.standalone import StandaloneSequence
from tests.engine.conftest import (
    LoadLibrary,
    make_core,
    needs_compiler,
    random_prompt,
    run_core,
    tiny_llama,
)


def decode_once(
    model: PagedLlama, prompt: list[int], next_token: int, native: bool = True
) -> tuple[torch.Tensor, StandaloneSequence]:
    """Prefill `prompt` into a fresh pool, then decode `next_token`: (logits, sequence)."""
    sequence = StandaloneSequence(model, len(prompt) + 1, native)
    sequence.prefill(prompt)
    return sequence.decode(next_token), sequence


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape",
    [
        {},  # packed weight tiles; vector attention where the KV pool is bf16
        {"hidden_size": 48, "intermediate_size": 100, "num_attention_heads": 4},  # portable
        {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 1},
        # Head sizes the vector attention takes: 64 (SmolLM2's), and 96 with 5 query heads
        # a K/V head (its sums kept 4 heads by 64 dimensions at a time, then the rest).
        {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1},
        {"hidden_size": 480, "num_attention_heads": 5, "num_key_value_heads": 1},
    ],
    ids=["vector", "portable", "biases", "head-64", "head-96"],
)
def test_native_step_matches_the_pytorch_step(dtype: torch.dtype, shape: dict[str, int]) -> None:
    hf = tiny_llama(seed=7, **shape)
    with torch.no_grad():  # random init leaves biases at zero: make them count
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                torch.nn.init.normal_(module.bias, std=0.5)
    prompt = random_prompt(37, seed=3)
    reference = PagedLlama.from_hf(hf, torch.device("cpu"), dtype, "int8")
    expected, expected_sequence = decode_once(reference, prompt, 11, native=False)
    assert expected_sequence.runner.native is None
    model = PagedLlama.from_hf(hf, torch.device("cpu"), dtype, "int8")
    logits, sequence = decode_once(model, prompt, 11)
    assert sequence.runner.native is not None
    # int16 activations against the PyTorch path's (bf16 or float32) ones: close, not equal.
    tolerance = 0.02 if dtype == torch.bfloat16 else 2e-3
    assert (logits - expected).norm() / expected.norm() < tolerance
    layers = zip(sequence.runner.pool.layers, expected_sequence.runner.pool.layers, strict=True)
    for layer, reference_layer in layers:
        k, v, k_ref, v_ref = layer.keys, layer.values, reference_layer.keys, reference_layer.values
        new, new_ref = k[:, -1].float(), k_ref[:, -1].float()  # the decoded token's K/V
        assert (new - new_ref).norm() / new_ref.norm() < tolerance
        assert (v[:, -1].float() - v_ref[:, -1].float()).norm() / v_ref[:, -1].float().norm() < (
            tolerance
        )
        torch.testing.assert_close(k[:, :-1], k_ref[:, :-1])  # the prompt's are untouched


@needs_compiler
def test_native_engine_decodes_like_the_pytorch_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixed batch (lengths 5 to 300, a shared prefix, chunked prefill beside decodes,
    preemption under a small pool), in float32: bf16 activations drift from int16 ones
    within a few tokens on random weights (test_quantized_weights.py measures bf16 engines
    against the float model). In a mixed step the decodes and chunks of up to
    NATIVE_CHUNK_MAX_TOKENS go native, longer chunks PyTorch."""
    steps: list[tuple[int, int]] = []  # (decodes, prefill chunks) of each step
    pytorch_decodes: list[int] = []
    run_model, pytorch_forward = ModelRunner.run_model, PagedLlama.forward

    def record(runner: ModelRunner, ids: Any, positions: Any, ctx: Any, *rest: Any) -> Any:
        steps.append((ctx.num_decodes, len(ctx.prefills)))
        return run_model(runner, ids, positions, ctx, *rest)

    def record_pytorch(model: PagedLlama, ids: Any, positions: Any, ctx: Any, *rest: Any) -> Any:
        pytorch_decodes.append(ctx.num_decodes)
        return pytorch_forward(model, ids, positions, ctx, *rest)

    monkeypatch.setattr(ModelRunner, "run_model", record)
    monkeypatch.setattr(PagedLlama, "forward", record_pytorch)
    hf = tiny_llama(seed=8)
    shared = random_prompt(48, seed=20)
    prompts = [random_prompt(5, 1), shared + random_prompt(9, 2), shared + random_prompt(30, 3)]
    prompts.append(random_prompt(300, 4))
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    results = {}
    for enabled in (False, True):
        core = make_core(
            hf,
            native_decode=enabled,
            weights="int8",
            dtype="float32",
            num_kv_blocks=26,
            block_size=16,
            max_batched_tokens=64,
        )
        for i, prompt in enumerate(prompts):
            core.add_request(f"r{i}", prompt, params)
        steps.clear()
        pytorch_decodes.clear()
        results[enabled] = run_core(core)
        assert any(decodes and chunks for decodes, chunks in steps)  # mixed steps ran
        assert (max(pytorch_decodes) == 0) == enabled
        assert (core.runner.native is not None) == enabled
        assert core.blocks.counts().used == 0
        assert core.scheduler.num_preemptions > 0
    agree = sum(
        a == b
        for i in range(len(prompts))
        for a, b in zip(results[True][f"r{i}"], results[False][f"r{i}"], strict=True)
    )
    assert agree >= 0.95 * len(prompts) * params.max_tokens
    assert all(results[True][f"r{i}"][:4] == results[False][f"r{i}"][:4] for i in range(4))


@needs_compiler
def test_native_decode_steps_use_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    native_threads: list[int] = []
    step = NativeDecoder.step

    def record(decoder: NativeDecoder, *args: Any) -> torch.Tensor:
        native_threads.append(args[3])
        return step(decoder, *args)

    monkeypatch.setattr(NativeDecoder, "step", record)
    core = make_core(tiny_llama(seed=9), weights="int8", kv_cache_mb=8, num_threads=2)
    core.add_request("a", random_prompt(40, seed=1), SamplingParams(max_tokens=3, ignore_eos=True))
    core.step()  # a 40-token prefill, through PyTorch: one parallel region per op
    assert native_threads == []
    core.step()  # one decode, native: the whole step in one parallel region
    assert native_threads == [2]
    core.add_request("b", random_prompt(3, seed=2), SamplingParams(max_tokens=3, ignore_eos=True))
    core.step()  # a decode beside a 3-token prompt, its rows native too
    assert native_threads == [2, 2]


def test_disabled_or_without_compiler_the_engine_keeps_its_pytorch_path(
    load_afresh: LoadLibrary, tmp_path: Path
) -> None:
    assert load_afresh(False) is None
    assert load_afresh(True, tmp_path / "cache", compiler=str(tmp_path / "no-such-cc")) is None
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    unbuildable = not_a_folder / "cache"
    assert load_afresh(True, unbuildable, compiler="cc") is None  # no folder: no build, no crash
    for settings in ({"native_decode": False}, {"native_cache_dir": unbuildable}):
        core = make_core(tiny_llama(seed=10), weights="int8", kv_cache_mb=8, **settings)
        params = SamplingParams(max_tokens=5, ignore_eos=True)
        core.add_request("a", random_prompt(6, seed=2), params)
        assert len(run_core(core)["a"]) == 5
        assert core.runner.native is None


def test_float_weights_never_take_the_native_path() -> None:
    model = PagedLlama.from_hf(tiny_llama(seed=11), torch.device("cpu"), torch.float32, "float")
    _, sequence = decode_once(model, random_prompt(8, seed=4), 3)
    assert sequence.runner.native is None
    for dtype in ("float32", "bfloat16"):  # nor in the engine, in either KV dtype
        assert make_core(tiny_llama(seed=11), dtype=dtype, kv_cache_mb=8).runner.native is None


@needs_compiler
def test_concurrent_native_steps_give_the_same_logits() -> None:
    """Two engines stepping at once: one owns the thread pool, the other runs its step on
    its own thread; neither waits for nor disturbs the other."""
    library = load_library()
    assert library is not None
    model = PagedLlama.from_hf(tiny_llama(seed=12), torch.device("cpu"), torch.float32, "int8")
    prompts = [random_prompt(30, seed=5), random_prompt(50, seed=6)]
    pools: list[KVPool] = [decode_once(model, p, 7)[1].runner.pool for p in prompts]
    decoders = [NativeDecoder(library, model, pool) for pool in pools]

    def step(index: int) -> torch.Tensor:
        position = len(prompts[index])  # rewrites the decoded token's own K/V: idempotent
        slots = torch.arange(position + 1)[None, :]
        return decoders[index].step(torch.tensor([7]), torch.tensor([position]), slots, 2)

    alone = [step(0), step(1)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(50):
            together = list(pool.map(step, [0, 1]))
            for got, expected in zip(together, alone, strict=True):
                torch.testing.assert_close(got, expected, rtol=0, atol=0)


@needs_compiler
def test_native_decoders_over_one_model_share_its_one_int8_copy() -> None:
    """The kernel reads the model's own int8 weights, re-laid in its tiles where this CPU's
    build reads tiles, rather than a copy per decoder beside the model's."""
    library = load_library()
    assert library is not None
    hf = tiny_llama(seed=7, hidden_size=128)  # 128 features: two scale groups a row
    model = PagedLlama.from_hf(hf, torch.device("cpu"), torch.bfloat16, "int8")
    qkv = model.layers[0].qkv
    assert isinstance(qkv, Int8Linear) and qkv.kernel_scales is None  # grouped scales
    row_major = qkv.quantized.clone()
    out, features = row_major.shape
    prompt = random_prompt(37, seed=3)
    first, first_sequence = decode_once(model, prompt, 11)
    second, second_sequence = decode_once(model, prompt, 11)
    for sequence in (first_sequence, second_sequence):
        decoder = sequence.runner.native
        assert decoder is not None
        assert decoder._model.layers[0].qkv.weight == qkv.quantized.data_ptr()
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    if library.bastion_packed_layout(out, features, qkv.group):
        # The same bytes, as the kernel packs them (e.g. 16 rows by 2 features): re-laid,
        # not requantized.
        assert qkv.tiled
        pack = PackShape.of(library)
        rows, depth = pack.rows, pack.depth
        tiles = qkv.quantized.view(out // rows, features // depth, rows, depth)
        assert torch.equal(tiles.permute(0, 2, 1, 3).reshape(out, features), row_major)
    else:
        assert not qkv.tiled and torch.equal(qkv.quantized, row_major)


@needs_compiler
def test_the_step_computes_logits_only_for_the_rows_asked() -> None:
    model = PagedLlama.from_hf(tiny_llama(seed=5), torch.device("cpu"), torch.float32, "int8")
    pool = KVPool.allocate(model.kv_layout, 8, 4, torch.device("cpu"))
    library = load_library(True)
    assert library is not None
    decoder = NativeDecoder(library, model, pool)
    rows = 6  # six one-token sequences, each in its own block
    ids, positions = torch.arange(3, 3 + rows), torch.zeros(rows, dtype=torch.long)
    slots = (torch.arange(rows) * 4)[:, None]
    every = decoder.step(ids, positions, slots, 2)
    some = decoder.step(ids, positions, slots, 2, torch.tensor([1, 4, 5]))
    assert every.shape[0] == rows and some.shape[0] == 3
    assert torch.equal(some, every[[1, 4, 5]])


@needs_compiler
def test_short_prompt_chunks_go_through_the_native_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prompts, and the rest of prompts after a cached prefix, of at most
    NATIVE_CHUNK_MAX_TOKENS run as rows of the native step, causal among themselves:
    no PyTorch pass, and the answers those of the PyTorch path (float32 activations)."""
    pytorch_passes: list[int] = []
    pytorch_forward = PagedLlama.forward

    def record_pytorch(model: PagedLlama, ids: Any, *rest: Any) -> Any:
        pytorch_passes.append(ids.shape[0])
        return pytorch_forward(model, ids, *rest)

    monkeypatch.setattr(PagedLlama, "forward", record_pytorch)
    hf = tiny_llama(seed=8)
    shared = random_prompt(NATIVE_CHUNK_MAX_TOKENS, seed=21)
    prompts = [random_prompt(5, 1), shared, shared + random_prompt(12, 2), random_prompt(30, 3)]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    results = {}
    for enabled in (False, True):
        core = make_core(hf, native_decode=enabled, weights="int8", dtype="float32")
        for i, prompt in enumerate(prompts):
            core.add_request(f"r{i}", prompt, params)
        pytorch_passes.clear()
        results[enabled] = run_core(core)
        assert (pytorch_passes == []) == enabled
    assert core.blocks.prefix_hits >= NATIVE_CHUNK_MAX_TOKENS  # r2 reused r1's blocks
    agree = sum(
        a == b
        for i in range(len(prompts))
        for a, b in zip(results[True][f"r{i}"], results[False][f"r{i}"], strict=True)
    )
    assert agree >= 0.95 * len(prompts) * params.max_tokens
