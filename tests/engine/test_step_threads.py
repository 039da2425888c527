"""A step's intra-op threads follow its size: one for a few decodes, all for larger steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from engine import SamplingParams
from engine.model_runner import SHARED_STEP_MIN_TOKENS
from tests.engine.conftest import make_core, random_prompt


def test_small_steps_run_on_one_thread_and_larger_ones_on_all(
    tiny_model: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward's threads follow the step's tokens; sampling a few rows takes one."""
    core = make_core(tiny_model, kv_cache_mb=8, num_threads=2)
    assert core.runner.threads == 2
    seen: list[tuple[str, int]] = []

    def watched(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, torch.get_num_threads()))
            return method(*args, **kwargs)

        return call

    monkeypatch.setattr(core.runner, "run_model", watched("forward", core.runner.run_model))
    monkeypatch.setattr(core.runner, "_sample", watched("sample", core.runner._sample))
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    core.add_request("long", random_prompt(SHARED_STEP_MIN_TOKENS + 4, seed=1), params)
    core.step()  # the whole prompt in one step
    core.step()  # one decode
    assert seen == [("forward", 2), ("sample", 1), ("forward", 1), ("sample", 1)]


def test_threads_left_alone_when_unset(tiny_model: LlamaForCausalLM) -> None:
    """As on CUDA, where `threads_for` gives None."""
    core = make_core(tiny_model, kv_cache_mb=8)
    core.runner.threads = None
    torch.set_num_threads(3)
    core.add_request("a", random_prompt(SHARED_STEP_MIN_TOKENS + 4, seed=2), SamplingParams())
    core.step()
    assert torch.get_num_threads() == 3
