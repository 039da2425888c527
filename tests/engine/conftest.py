"""Tiny random-weight Llama models and helpers to compare the paged engine with transformers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine import (
    ChatMessage,
    Engine,
    EngineConfig,
    GenerationRequest,
    PagedEngine,
    SamplingParams,
    TokenDelta,
    resolve_engine_config,
)
from engine.core import EngineCore, StepOutput
from engine.llama import PagedLlama
from engine.model_runner import ModelRunner
from engine.native_library import find_compiler, load_library

VOCAB = 512

# Only a missing compiler skips: a kernel that fails to build where one exists fails the tests.
needs_compiler = pytest.mark.skipif(
    find_compiler() is None, reason="no C compiler to build the native kernel"
)


def tiny_llama(seed: int = 0, **overrides: object) -> LlamaForCausalLM:
    """A 2-layer GQA Llama with weights large enough that greedy choices are not near-ties."""
    torch.manual_seed(seed)
    settings: dict[str, object] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "initializer_range": 0.2,
        "rope_theta": 10000.0,
    }
    settings.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**settings)).eval()
    model.generation_config.eos_token_id = None  # ids are random: no token ends a sequence
    return model


def hf_greedy(model: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy continuation of `prompt` (fp32, batch of one)."""
    ids = torch.tensor([list(prompt)])
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return list(out[0, len(prompt) :].tolist())


def random_prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return list(torch.randint(0, VOCAB, (length,), generator=generator).tolist())


def token_ids(outputs: Sequence[StepOutput]) -> list[int]:
    return [o.token_id for o in outputs if o.token_id is not None]


def make_core(model: LlamaForCausalLM, **config: object) -> EngineCore:
    """A synchronous engine core (no thread) over `model`, for step-by-step tests."""
    config.setdefault("num_threads", 1)
    engine_config = resolve_engine_config(EngineConfig(**config), "cpu")  # type: ignore[arg-type]
    paged = PagedLlama.from_hf(
        model,
        torch.device("cpu"),
        engine_config.torch_dtype("cpu"),
        engine_config.weight_format,
        calibration_ids=random_prompt(64, seed=0),  # read under w8a8 only
    )
    runner = ModelRunner.from_config(paged, engine_config)
    return EngineCore(runner, engine_config, "tiny", frozenset())


def run_core(core: EngineCore, max_steps: int = 10_000) -> dict[str, list[int]]:
    """Step until idle; the generated ids of each sequence."""
    generated: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not core.has_work:
            return generated
        for out in core.step():
            if out.token_id is not None:
                generated.setdefault(out.seq_id, []).append(out.token_id)
    raise AssertionError("the engine did not become idle")


def assert_no_block_held(core: EngineCore) -> None:
    counts = core.blocks.counts()
    assert counts.used == 0, counts
    assert counts.free + counts.cached == counts.total
    assert all(core.blocks.ref_count(b) == 0 for b in range(counts.total))


@pytest.fixture(autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    """Tiny models run faster on one thread, and much faster when the CPU is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture
def make_engine(tiny_model: LlamaForCausalLM) -> Iterator[Callable[..., PagedEngine]]:
    """Build threaded engines over the tiny model; all are closed after the test."""
    engines: list[PagedEngine] = []

    def build(**config: object) -> PagedEngine:
        config.setdefault("kv_cache_mb", 8)
        config.setdefault("num_threads", 1)
        engine = PagedEngine.from_hf_model(
            tiny_model,
            None,
            "tiny",
            device="cpu",
            config=EngineConfig(**config),  # type: ignore[arg-type]
        )
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.close()


GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
QUESTION = (ChatMessage("user", "List the days of the week."),)


def collect_deltas(engine: Engine, request: GenerationRequest) -> list[TokenDelta]:
    """Every delta of `request`'s stream, gathered synchronously."""

    async def collect() -> list[TokenDelta]:
        return [delta async for delta in engine.stream(request)]

    return asyncio.run(collect())


LoadLibrary = Callable[..., Any]


@pytest.fixture
def load_afresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoadLibrary]:
    """`load_library(enabled, cache_dir)` with its cache cleared first; `compiler` sets CC."""

    def load(enabled: bool = True, cache_dir: Path | None = None, compiler: str = "") -> Any:
        if compiler:
            monkeypatch.setenv("CC", compiler)
        load_library.cache_clear()
        return load_library(enabled, cache_dir)

    yield load
    load_library.cache_clear()
