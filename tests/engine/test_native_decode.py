"""The native decode step (engine/native/decode_step.c) against the PyTorch path."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import SamplingParams, native_decode
from engine.attention import AttentionContext, PrefillChunk
from engine.llama import PagedLlama, throwaway_kv_cache
from engine.native_decode import NativeDecoder
from tests.engine.conftest import make_core, random_prompt, run_core, tiny_llama


@pytest.fixture
def native_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """Set BASTION_NATIVE_DECODE (and friends) for this test; the library is reloaded."""

    def use(enabled: bool, **env: str) -> Any:
        monkeypatch.setenv(native_decode.DISABLE_ENV, "1" if enabled else "0")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        native_decode.load_library.cache_clear()
        return native_decode.load_library()

    yield use
    native_decode.load_library.cache_clear()


needs_compiler = pytest.mark.skipif(
    native_decode.load_library() is None, reason="no C compiler to build the native kernel"
)


def decode_once(
    model: PagedLlama, prompt: list[int], next_token: int
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Prefill `prompt` into a fresh cache, then decode `next_token`: (logits, cache)."""
    n = len(prompt) + 1
    cache = throwaway_kv_cache(model, n)
    prefill = AttentionContext(
        torch.arange(n - 1), 0, None, None, (PrefillChunk(0, n - 1, None, None),)
    )
    with torch.inference_mode():
        model.forward(torch.tensor(prompt), torch.arange(n - 1), prefill, cache, torch.tensor([]))
        decode = AttentionContext(torch.tensor([n - 1]), 1, torch.arange(n)[None, :], None, ())
        logits = model.forward(
            torch.tensor([next_token]), torch.tensor([n - 1]), decode, cache, torch.tensor([0])
        )
    return logits, cache


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape",
    [
        {},  # packed weight tiles; vector attention where the KV pool is bf16
        {"hidden_size": 48, "intermediate_size": 100, "num_attention_heads": 4},  # portable
        {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 1},
    ],
    ids=["vector", "portable", "biases"],
)
def test_native_step_matches_the_pytorch_step(
    native_setting: Any, dtype: torch.dtype, shape: dict[str, int]
) -> None:
    hf = tiny_llama(seed=7, **shape)
    with torch.no_grad():  # random init leaves biases at zero: make them count
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                torch.nn.init.normal_(module.bias, std=0.5)
    prompt = random_prompt(37, seed=3)
    native_setting(False)
    reference = PagedLlama(hf, torch.device("cpu"), dtype, "int8")
    expected, expected_cache = decode_once(reference, prompt, 11)
    assert reference.native_decoder(expected_cache) is None
    native_setting(True)
    model = PagedLlama(hf, torch.device("cpu"), dtype, "int8")
    logits, cache = decode_once(model, prompt, 11)
    assert model.native_decoder(cache) is not None
    # int16 activations against the PyTorch path's (bf16 or float32) ones: close, not equal.
    tolerance = 0.02 if dtype == torch.bfloat16 else 2e-3
    assert (logits - expected).norm() / expected.norm() < tolerance
    for (k, v), (k_ref, v_ref) in zip(cache, expected_cache, strict=True):
        new, new_ref = k[:, -1].float(), k_ref[:, -1].float()  # the decoded token's K/V
        assert (new - new_ref).norm() / new_ref.norm() < tolerance
        assert (v[:, -1].float() - v_ref[:, -1].float()).norm() / v_ref[:, -1].float().norm() < (
            tolerance
        )
        torch.testing.assert_close(k[:, :-1], k_ref[:, :-1])  # the prompt's are untouched


@needs_compiler
def test_native_engine_decodes_like_the_pytorch_engine(
    native_setting: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixed batch (lengths 5 to 300, a shared prefix, chunked prefill beside decodes,
    preemption under a small pool), in float32: bf16 activations drift from int16 ones
    within a few tokens on random weights (test_quantized_weights.py measures bf16 engines
    against the float model). In a mixed step the decodes go native, the chunks PyTorch."""
    steps: list[tuple[int, int]] = []  # (decodes, prefill chunks) of each step
    pytorch_decodes: list[int] = []
    forward, pytorch_forward = PagedLlama.forward, PagedLlama._forward

    def record(model: PagedLlama, ids: Any, positions: Any, ctx: Any, *rest: Any) -> Any:
        steps.append((ctx.num_decodes, len(ctx.prefills)))
        return forward(model, ids, positions, ctx, *rest)

    def record_pytorch(model: PagedLlama, ids: Any, positions: Any, ctx: Any, *rest: Any) -> Any:
        pytorch_decodes.append(ctx.num_decodes)
        return pytorch_forward(model, ids, positions, ctx, *rest)

    monkeypatch.setattr(PagedLlama, "forward", record)
    monkeypatch.setattr(PagedLlama, "_forward", record_pytorch)
    hf = tiny_llama(seed=8)
    shared = random_prompt(48, seed=20)
    prompts = [random_prompt(5, 1), shared + random_prompt(9, 2), shared + random_prompt(30, 3)]
    prompts.append(random_prompt(300, 4))
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    results = {}
    for enabled in (False, True):
        native_setting(enabled)
        core = make_core(
            hf,
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
        assert (core.runner.model.native_decoder(core.runner.kv_cache) is not None) == enabled
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
def test_native_decode_steps_use_every_thread(native_setting: Any) -> None:
    native_setting(True)
    core = make_core(tiny_llama(seed=9), weights="int8", kv_cache_mb=8, num_threads=2)
    core.add_request("a", random_prompt(3, seed=1), SamplingParams(max_tokens=3, ignore_eos=True))
    core.step()  # a 3-token prefill: one thread
    assert torch.get_num_threads() == 1
    core.step()  # one decode, native: the whole step in one parallel region
    assert torch.get_num_threads() == 2


def test_disabled_or_without_compiler_the_engine_keeps_its_pytorch_path(
    native_setting: Any, tmp_path: Path
) -> None:
    assert native_setting(False) is None
    assert (
        native_setting(
            True,
            CC=str(tmp_path / "no-such-cc"),
            **{native_decode.CACHE_ENV: str(tmp_path / "cache")},
        )
        is None
    )
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    cache = {native_decode.CACHE_ENV: str(not_a_folder / "cache")}
    assert native_setting(True, CC="cc", **cache) is None  # no cache folder: no build, no crash
    core = make_core(tiny_llama(seed=10), weights="int8", kv_cache_mb=8)
    core.add_request("a", random_prompt(6, seed=2), SamplingParams(max_tokens=5, ignore_eos=True))
    assert len(run_core(core)["a"]) == 5
    assert core.runner.model.native_decoder(core.runner.kv_cache) is None


@needs_compiler
def test_the_library_is_built_once_per_machine(native_setting: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert native_setting(True, **{native_decode.CACHE_ENV: str(cache)}) is not None
    (built,) = cache.glob("decode_step-*.so")
    first = built.stat().st_mtime_ns
    assert native_setting(True, **{native_decode.CACHE_ENV: str(cache)}) is not None
    assert list(cache.glob("*")) == [built] and built.stat().st_mtime_ns == first


def test_float_weights_never_take_the_native_path(native_setting: Any) -> None:
    native_setting(True)
    model = PagedLlama(tiny_llama(seed=11), torch.device("cpu"), torch.float32, "float")
    _, cache = decode_once(model, random_prompt(8, seed=4), 3)
    assert model.native_decoder(cache) is None


@needs_compiler
def test_concurrent_native_steps_give_the_same_logits(native_setting: Any) -> None:
    """Two engines stepping at once: one owns the thread pool, the other runs its step on
    its own thread; neither waits for nor disturbs the other."""
    library = native_setting(True)
    model = PagedLlama(tiny_llama(seed=12), torch.device("cpu"), torch.float32, "int8")
    prompts = [random_prompt(30, seed=5), random_prompt(50, seed=6)]
    sessions = [decode_once(model, prompt, 7)[1] for prompt in prompts]
    decoders = [NativeDecoder(library, model, cache) for cache in sessions]
    embeddings = torch.nn.functional.embedding(torch.tensor([7]), model.embed)

    def step(index: int) -> torch.Tensor:
        position = len(prompts[index])  # rewrites the decoded token's own K/V: idempotent
        slots = torch.arange(position + 1)[None, :]
        return decoders[index].step(embeddings, torch.tensor([position]), slots, 2)

    alone = [step(0), step(1)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(50):
            together = list(pool.map(step, [0, 1]))
            for got, expected in zip(together, alone, strict=True):
                torch.testing.assert_close(got, expected, rtol=0, atol=0)
