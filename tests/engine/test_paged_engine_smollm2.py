"""The paged engine on the real SmolLM2 weights, through the chat-level `Engine` API."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from engine import (
    ChatMessage,
    EngineConfig,
    GenerationRequest,
    PagedEngine,
    SamplingParams,
    TokenDelta,
    default_model_source,
    paged_engine,
)
from engine.linear import fbgemm_supported
from engine.native_library import load_library
from tests.engine.conftest import QUESTION, collect_deltas


def test_greedy_chat_equals_transformers_generate(
    chat_engine: PagedEngine, smollm2: tuple[Any, Any]
) -> None:
    model, tokenizer = smollm2
    system = ChatMessage("system", "You are a terse assistant. " * 60)  # a long shared prefix
    requests = [
        GenerationRequest("a", QUESTION, SamplingParams(max_tokens=24)),
        GenerationRequest("b", (system, *QUESTION), SamplingParams(max_tokens=24)),
        GenerationRequest("c", (system, ChatMessage("user", "Name two colours."))),
    ]
    requests[2] = GenerationRequest("c", requests[2].messages, SamplingParams(max_tokens=24))

    async def all_at_once() -> list[list[TokenDelta]]:
        async def one(r: GenerationRequest) -> list[TokenDelta]:
            return [d async for d in chat_engine.stream(r)]

        return list(await asyncio.gather(*(one(r) for r in requests)))

    results = asyncio.run(all_at_once())
    for request, deltas in zip(requests, results, strict=True):
        conversation = [{"role": m.role, "content": m.content} for m in request.messages]
        prompt = tokenizer.apply_chat_template(
            conversation, add_generation_prompt=True, return_tensors="pt"
        )
        with torch.inference_mode():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=24,
                do_sample=False,
                eos_token_id=[2, tokenizer.convert_tokens_to_ids("<|im_end|>")],
                pad_token_id=2,
            )
        expected = tokenizer.decode(
            out[0, prompt.shape[1] :], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        assert "".join(d.text for d in deltas) == expected
        assert deltas[-1].finish_reason in ("stop", "length")
        assert deltas[-1].prompt_tokens == prompt.shape[1]
    assert chat_engine.metrics().prefix_cache_hit_tokens > 0


def test_stop_string_and_logprobs_through_the_chat_api(chat_engine: PagedEngine) -> None:
    full = collect_deltas(
        chat_engine, GenerationRequest("f", QUESTION, SamplingParams(max_tokens=30))
    )
    text = "".join(d.text for d in full)
    word = text.split()[3]
    params = SamplingParams(max_tokens=30, stop=(word,), logprobs=True, top_logprobs=2)
    deltas = collect_deltas(chat_engine, GenerationRequest("s", QUESTION, params))
    stopped = "".join(d.text for d in deltas)
    assert word not in stopped
    assert text.startswith(stopped)
    assert deltas[-1].finish_reason == "stop"
    logprobs = [lp for d in deltas for lp in d.logprobs]
    assert len(logprobs) == deltas[-1].completion_tokens
    assert all(lp.logprob <= 0 and len(lp.top) == 2 for lp in logprobs)
    assert chat_engine.count_prompt_tokens(QUESTION) == deltas[-1].prompt_tokens
    assert chat_engine.call(lambda core: core.blocks.counts().used) == 0


def test_load_resolves_auto_weights_for_the_device(
    smollm2: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    requested: list[torch.dtype] = []

    def already_loaded(_source: Any, dtype: torch.dtype) -> tuple[Any, Any]:
        requested.append(dtype)
        return smollm2

    monkeypatch.setattr(paged_engine, "load_model", already_loaded)
    # The path of every model whose prepared weights are not kept (tests/engine/
    # test_prepared_weights.py covers the kept ones).
    monkeypatch.setattr(paged_engine, "load_prepared", lambda *_: None)
    config = EngineConfig(kv_cache_mb=16, weights="auto", num_threads=1)
    engine = PagedEngine.load(default_model_source(), device="cpu", config=config)
    try:
        expected = "int8" if load_library() or not fbgemm_supported() else "fp16"
        assert engine.call(lambda core: core.config.weights) == expected
        assert requested == [torch.float32]  # compact weights start from full precision
        deltas = collect_deltas(
            engine, GenerationRequest("a", QUESTION, SamplingParams(max_tokens=4))
        )
        assert deltas[-1].completion_tokens == 4
    finally:
        engine.close()
