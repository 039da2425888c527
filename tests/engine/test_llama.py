"""The paged model code across the Llama family's variants, against transformers."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine.llama import UnsupportedModel, shape_of
from engine.types import SamplingParams
from tests.engine.conftest import hf_greedy, make_core, random_prompt, run_core, tiny_llama

PARAMS = SamplingParams(max_tokens=10, ignore_eos=True)


def assert_matches_transformers(model: torch.nn.Module) -> None:
    core = make_core(model, max_batched_tokens=64)  # type: ignore[arg-type]
    prompts = [random_prompt(n, seed=n) for n in (3, 40, 150)]
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, PARAMS)
    generated = run_core(core)
    for i, prompt in enumerate(prompts):
        assert generated[f"r{i}"] == hf_greedy(model, prompt, PARAMS.max_tokens)


def test_llama3_rope_scaling_and_untied_head() -> None:
    model = tiny_llama(
        seed=1,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    assert_matches_transformers(model)


def test_attention_bias_and_mlp_bias() -> None:
    assert_matches_transformers(tiny_llama(seed=2, attention_bias=True, mlp_bias=True))


def test_qwen2_with_qkv_bias() -> None:
    torch.manual_seed(3)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        initializer_range=0.2,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    for layer in model.model.layers:  # random init leaves biases at zero: make them count
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            torch.nn.init.normal_(proj.bias, std=0.5)
    model.generation_config.eos_token_id = None
    assert_matches_transformers(model)


def test_unsupported_settings_are_refused() -> None:
    config = tiny_llama().config
    config.model_type = "gpt2"
    with pytest.raises(UnsupportedModel, match="not supported"):
        shape_of(config)


def test_model_dtype_follows_config(tiny_model: LlamaForCausalLM) -> None:
    core = make_core(tiny_model, dtype="bfloat16")
    model = core.runner.model
    assert model.dtype == model.embed.dtype == model.layers[0].input_norm.dtype == torch.bfloat16
    assert all(
        cache.keys.dtype == cache.values.dtype == torch.bfloat16
        for cache in core.runner.pool.layers
    )
    core.add_request("r", random_prompt(20, 1), PARAMS)
    assert len(run_core(core)["r"]) == PARAMS.max_tokens
