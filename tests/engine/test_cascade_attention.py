"""Prefill chunks that begin with the same cached blocks attend to them together (cascade
attention): the runner finds the shared run, and the answers stay those of transformers."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import LlamaForCausalLM

from engine.attention import AttentionContext
from engine.model_runner import CASCADE_MIN_TOKENS, ModelRunner
from engine.types import SamplingParams

from .conftest import hf_greedy, make_core, random_prompt, run_core

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture
def step_contexts(monkeypatch: pytest.MonkeyPatch) -> list[AttentionContext]:
    """Every step's attention context, as the runner hands it to the model."""
    contexts: list[AttentionContext] = []
    run_model = ModelRunner.run_model

    def record(runner: ModelRunner, ids: Any, positions: Any, ctx: Any, *rest: Any) -> Any:
        contexts.append(ctx)
        return run_model(runner, ids, positions, ctx, *rest)

    monkeypatch.setattr(ModelRunner, "run_model", record)
    return contexts


def test_questions_after_a_cached_system_prompt_share_it_and_keep_their_answers(
    tiny_model: LlamaForCausalLM, step_contexts: list[AttentionContext]
) -> None:
    shared = random_prompt(300, seed=7)
    core = make_core(tiny_model)
    core.add_request("warm", shared + random_prompt(5, seed=8), GREEDY)
    run_core(core)
    prompts = {f"q{n}": shared + random_prompt(n, seed=20 + n) for n in (3, 11, 30)}
    prompts["other"] = random_prompt(120, seed=50)  # no cached block in common
    for seq_id, prompt in prompts.items():
        core.add_request(seq_id, prompt, GREEDY)
    step_contexts.clear()
    generated = run_core(core)
    for seq_id, prompt in prompts.items():
        assert generated[seq_id] == hf_greedy(tiny_model, prompt, GREEDY.max_tokens), seq_id
    first = step_contexts[0]
    assert len(first.shared_prefixes) == 1
    group = first.shared_prefixes[0]
    # The 18 whole blocks of the 300 shared tokens, read once for the three questions.
    assert group.slots.shape[0] == 288
    assert sorted(first.prefills[i].length for i in group.chunks) == [3 + 12, 11 + 12, 30 + 12]
    assert all(not ctx.shared_prefixes for ctx in step_contexts[1:])  # decodes from then on


def test_a_short_shared_run_is_attended_chunk_by_chunk(
    tiny_model: LlamaForCausalLM, step_contexts: list[AttentionContext]
) -> None:
    shared = random_prompt(CASCADE_MIN_TOKENS - 16, seed=9)
    core = make_core(tiny_model)
    core.add_request("warm", shared + random_prompt(20, seed=10), GREEDY)
    run_core(core)
    prompts = {f"q{n}": shared + random_prompt(n, seed=30 + n) for n in (4, 9)}
    for seq_id, prompt in prompts.items():
        core.add_request(seq_id, prompt, GREEDY)
    step_contexts.clear()
    generated = run_core(core)
    assert step_contexts[0].prefills and all(
        c.context_slots is not None for c in step_contexts[0].prefills
    )
    assert not step_contexts[0].shared_prefixes
    for seq_id, prompt in prompts.items():
        assert generated[seq_id] == hf_greedy(tiny_model, prompt, GREEDY.max_tokens), seq_id
