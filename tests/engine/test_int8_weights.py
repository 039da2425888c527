"""Int8 projection weights: close to the float model, same answers on the real SmolLM2."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from engine import ChatMessage, EngineConfig, GenerationRequest, PagedEngine, SamplingParams
from engine.linear import INT8_KERNEL_MAX_ROWS, DenseLinear, Int8Linear, make_linear, quantize_int8
from tests.engine.conftest import hf_greedy, make_core, random_prompt, run_core, tiny_llama

PARAMS = SamplingParams(max_tokens=10, ignore_eos=True)


def test_quantization_error_is_within_half_a_step() -> None:
    weight = torch.randn(64, 48) * torch.linspace(0.01, 3.0, 64)[:, None]
    quantized, scales = quantize_int8(weight, torch.float32)
    assert quantized.dtype == torch.int8
    restored = quantized.float() * scales[:, None]
    assert torch.all((restored - weight).abs() <= scales[:, None] / 2 + 1e-6)
    assert quantized.abs().amax(dim=1).eq(127).all()  # every row uses its full range


def test_int8_kernel_and_dense_twin_agree() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64), torch.randn(96).bfloat16()
    linear = make_linear(weight, bias, torch.bfloat16, int8=True)
    assert isinstance(linear, Int8Linear)
    x = torch.randn(INT8_KERNEL_MAX_ROWS + 4, 64, dtype=torch.bfloat16)
    batched = linear(x)  # more rows than the kernel takes: the dequantized dense path
    one_by_one = torch.cat([linear(x[i : i + 1]) for i in range(x.shape[0])])  # int8 kernel
    torch.testing.assert_close(one_by_one.float(), batched.float(), rtol=0.02, atol=0.05)
    reference = x.float() @ weight.T + bias.float()
    error = (batched.float() - reference).norm() / reference.norm()
    assert error < 0.02


def test_dense_mode_keeps_tied_embeddings_shared() -> None:
    linear = make_linear(torch.randn(8, 4), None, torch.float32, int8=False)
    assert isinstance(linear, DenseLinear)


def test_int8_engine_follows_the_float_model_greedily() -> None:
    """Quantization noise may flip a rare near-tie, never the bulk of the continuation."""
    model = tiny_llama(seed=4)
    core = make_core(model, int8_weights=True, max_batched_tokens=64)
    assert core.runner.model.dtype == torch.bfloat16
    prompts = [random_prompt(n, seed=n) for n in (3, 40, 150)]
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, PARAMS)
    generated = run_core(core)
    same = 0
    for i, prompt in enumerate(prompts):
        expected = hf_greedy(model, prompt, PARAMS.max_tokens)
        assert generated[f"r{i}"][0] == expected[0]
        same += sum(a == b for a, b in zip(generated[f"r{i}"], expected, strict=True))
    assert same >= 0.8 * len(prompts) * PARAMS.max_tokens


@pytest.mark.slow
def test_smollm2_int8_answers_like_float(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    config = EngineConfig(kv_cache_mb=64, int8_weights=True)
    engine = PagedEngine.from_hf_model(model, tokenizer, "smollm2-int8", "cpu", config=config)
    try:
        question = (ChatMessage("user", "What is the capital of France?"),)
        request = GenerationRequest("q", question, SamplingParams(max_tokens=16))

        async def answer() -> str:
            return "".join([d.text async for d in engine.stream(request)])

        assert "Paris" in asyncio.run(answer())
    finally:
        engine.close()
