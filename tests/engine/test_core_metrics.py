"""The engine's generation rate: tokens of the steps in the last window, over its time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import LlamaForCausalLM

import engine.core
from engine import SamplingParams
from tests.engine.conftest import make_core, random_prompt


def test_the_rate_counts_the_window_and_forgets_older_steps(
    tiny_model: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core(tiny_model, kv_cache_mb=8)
    clock = [1000.0]
    monkeypatch.setattr(engine.core, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    core.add_request("a", random_prompt(6, seed=1), SamplingParams(max_tokens=5, ignore_eos=True))
    for _ in range(5):  # the prompt and its first token, then one token a step
        core.step()
        clock[0] += 0.5
    # The first step's token is not counted: the rate runs from its time, 2.5 s before now,
    # over the 4 tokens after it.
    assert core.metrics().generation_tokens_per_second == pytest.approx(4 / 2.5)
    clock[0] += 8.5  # the first two steps are now over 10 s old: 3 remain, from 10 s ago
    assert core.metrics().generation_tokens_per_second == pytest.approx(2 / 10)
    clock[0] += 60
    assert core.metrics().generation_tokens_per_second == 0.0
