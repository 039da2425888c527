"""Continuous batching: token budget, decodes first, chunked prefill, preemption, no leaks."""

from __future__ import annotations

from transformers import LlamaForCausalLM

from engine.types import SamplingParams
from tests.engine.conftest import (
    GREEDY,
    assert_no_block_held,
    hf_greedy,
    make_core,
    random_prompt,
    run_core,
)


def test_decodes_come_first_and_prefill_is_chunked_to_the_budget(
    tiny_model: LlamaForCausalLM,
) -> None:
    core = make_core(tiny_model, max_batched_tokens=64, max_num_seqs=4)
    core.add_request("short", random_prompt(10, 1), GREEDY)
    first = core.scheduler.schedule()
    assert [(s.seq_id, n) for s, n in first.entries] == [("short", 10)]
    core.runner.run(first)
    core.scheduler.after_step(first)
    core.scheduler.running[0].token_ids.append(7)  # as if sampled
    core.add_request("long", random_prompt(150, 2), GREEDY)
    second = core.scheduler.schedule()
    assert [(s.seq_id, n) for s, n in second.entries] == [("short", 1), ("long", 63)]
    assert second.num_tokens == 64


def test_max_num_seqs_bounds_the_running_set(tiny_model: LlamaForCausalLM) -> None:
    core = make_core(tiny_model, max_batched_tokens=256, max_num_seqs=2)
    for i in range(4):
        core.add_request(f"r{i}", random_prompt(5, i), GREEDY)
    batch = core.scheduler.schedule()
    assert len(batch.entries) == 2
    assert len(core.scheduler.waiting) == 2


def test_preemption_recomputes_and_output_stays_identical(tiny_model: LlamaForCausalLM) -> None:
    # 12 blocks of 16 tokens; four requests that each grow to 5 blocks cannot all fit.
    core = make_core(tiny_model, num_kv_blocks=12, max_batched_tokens=128)
    prompts = [random_prompt(40, 10 + i) for i in range(4)]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, params)
    generated = run_core(core)
    assert core.scheduler.num_preemptions > 0
    for i, prompt in enumerate(prompts):
        assert generated[f"r{i}"] == hf_greedy(tiny_model, prompt, 40)
    assert_no_block_held(core)


def test_cancelled_waiting_and_running_requests_free_their_blocks(
    tiny_model: LlamaForCausalLM,
) -> None:
    core = make_core(tiny_model, num_kv_blocks=16, max_batched_tokens=64, max_num_seqs=2)
    for i in range(4):
        core.add_request(f"r{i}", random_prompt(30, i), SamplingParams(max_tokens=50))
    core.step()
    core.step()
    assert core.blocks.counts().used > 0
    assert core.abort("r0")  # running
    assert core.abort("r3")  # waiting
    assert not core.abort("r3")
    run_core(core)
    assert_no_block_held(core)


def test_a_request_waits_for_a_prefix_that_is_being_computed(
    tiny_model: LlamaForCausalLM,
) -> None:
    core = make_core(tiny_model, max_batched_tokens=512)  # room for both: second still waits
    shared = random_prompt(200, 7)
    core.add_request("first", [*shared, 1], GREEDY)
    core.add_request("second", [*shared, 2], GREEDY)
    core.step()
    assert [s.seq_id for s in core.scheduler.running] == ["first"]  # second waits for it
    generated = run_core(core)
    assert core.blocks.prefix_hits >= 192
    assert generated["second"] == hf_greedy(tiny_model, [*shared, 2], GREEDY.max_tokens)
