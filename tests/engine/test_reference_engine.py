"""The reference engine (a plain transformers decode loop) on the real SmolLM2 weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine import (
    ContextLengthExceeded,
    GenerationRequest,
    SamplingParams,
    TransformersEngine,
)
from tests.engine.conftest import QUESTION, collect_deltas


def test_greedy_output_equals_transformers_generate(hf_chat_engine: TransformersEngine) -> None:
    deltas = collect_deltas(
        hf_chat_engine, GenerationRequest("g", QUESTION, SamplingParams(max_tokens=20))
    )
    ours = "".join(d.text for d in deltas)
    tokenizer, model = hf_chat_engine._tokenizer, hf_chat_engine._model
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION[0].content}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    with torch.inference_mode():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=2,
            pad_token_id=2,
        )
    expected = tokenizer.decode(
        out[0, prompt.shape[1] :], skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    assert ours == expected
    assert deltas[-1].finish_reason in ("stop", "length")
    assert deltas[-1].completion_tokens <= 20


def test_max_tokens_ends_with_length(hf_chat_engine: TransformersEngine) -> None:
    deltas = collect_deltas(
        hf_chat_engine, GenerationRequest("l", QUESTION, SamplingParams(max_tokens=3))
    )
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].completion_tokens == 3


def test_stop_string_ends_the_answer_before_it(hf_chat_engine: TransformersEngine) -> None:
    full = "".join(
        d.text
        for d in collect_deltas(
            hf_chat_engine, GenerationRequest("f", QUESTION, SamplingParams(max_tokens=30))
        )
    )
    word = full.split()[3]
    deltas = collect_deltas(
        hf_chat_engine,
        GenerationRequest("s", QUESTION, SamplingParams(max_tokens=30, stop=(word,))),
    )
    text = "".join(d.text for d in deltas)
    assert word not in text
    assert full.startswith(text)
    assert deltas[-1].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(hf_chat_engine: TransformersEngine) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.9, seed=42)
    first = "".join(
        d.text for d in collect_deltas(hf_chat_engine, GenerationRequest("a", QUESTION, params))
    )
    second = "".join(
        d.text for d in collect_deltas(hf_chat_engine, GenerationRequest("b", QUESTION, params))
    )
    assert first == second


def test_closing_the_stream_stops_generation(hf_chat_engine: TransformersEngine) -> None:
    async def take_two_then_close() -> int:
        stream = hf_chat_engine.stream(
            GenerationRequest("c", QUESTION, SamplingParams(max_tokens=500))
        )
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 2:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return seen

    assert asyncio.run(take_two_then_close()) == 2
    # The worker is free again: a new request completes promptly.
    deltas = collect_deltas(
        hf_chat_engine, GenerationRequest("n", QUESTION, SamplingParams(max_tokens=2))
    )
    assert deltas[-1].completion_tokens == 2


def test_prompt_beyond_context_is_refused(hf_chat_engine: TransformersEngine) -> None:
    request = GenerationRequest(
        "x", QUESTION, SamplingParams(max_tokens=hf_chat_engine.context_window)
    )
    with pytest.raises(ContextLengthExceeded, match="maximum context length"):
        collect_deltas(hf_chat_engine, request)
