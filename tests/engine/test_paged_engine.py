"""The paged engine against transformers' greedy output, and its async surface."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from transformers import LlamaForCausalLM

from engine import (
    ContextLengthExceeded,
    EngineError,
    EngineOverloaded,
    PagedEngine,
    SamplingParams,
)
from engine.core import StepOutput
from tests.engine.conftest import (
    GREEDY,
    assert_no_block_held,
    hf_greedy,
    make_core,
    random_prompt,
    run_core,
    token_ids,
)

LENGTHS = (1, 2, 15, 16, 17, 100, 513, 1500)


def test_greedy_matches_transformers_alone_and_batched(
    tiny_model: LlamaForCausalLM, make_engine: Callable[..., PagedEngine]
) -> None:
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    expected = [hf_greedy(tiny_model, p, GREEDY.max_tokens) for p in prompts]
    engine = make_engine(max_batched_tokens=256, enable_prefix_caching=False)
    for prompt, want in zip(prompts, expected, strict=True):
        assert token_ids(engine.generate([prompt], GREEDY)[0]) == want
    batched = engine.generate(prompts, GREEDY)
    assert [token_ids(outs) for outs in batched] == expected


def test_greedy_matches_with_prefix_cache_hits(
    tiny_model: LlamaForCausalLM, make_engine: Callable[..., PagedEngine]
) -> None:
    shared = random_prompt(300, seed=99)
    prompts = [shared + random_prompt(n, seed=100 + n) for n in (1, 7, 40, 200)]
    expected = [hf_greedy(tiny_model, p, GREEDY.max_tokens) for p in prompts]
    engine = make_engine(max_batched_tokens=128)
    assert token_ids(engine.generate([prompts[0]], GREEDY)[0]) == expected[0]
    assert [token_ids(o) for o in engine.generate(prompts, GREEDY)] == expected
    # A whole prompt already cached, then one that ends on a block boundary.
    assert token_ids(engine.generate([prompts[2]], GREEDY)[0]) == expected[2]
    assert token_ids(engine.generate([shared[:288]], GREEDY)[0]) == hf_greedy(
        tiny_model, shared[:288], GREEDY.max_tokens
    )
    metrics = engine.metrics()
    assert metrics.prefix_cache_hit_rate > 0.5
    assert metrics.kv_blocks_used == 0
    assert metrics.kv_blocks_cached > 0


def test_continuations_share_generated_blocks_and_tenants_do_not(
    tiny_model: LlamaForCausalLM,
) -> None:
    core = make_core(tiny_model, max_batched_tokens=128)
    prompt = random_prompt(60, seed=5)
    core.add_request("a", prompt, SamplingParams(max_tokens=40, ignore_eos=True), "t1")
    first = run_core(core)["a"]
    follow_up = prompt + first + random_prompt(5, seed=6)
    before = core.blocks.prefix_hits
    core.add_request("b", follow_up, GREEDY, "t1")
    run_core(core)
    assert core.blocks.prefix_hits - before == 96  # prompt and answer blocks, reused
    held: dict[str, set[int]] = {}
    for tenant in ("t1", "t2"):
        seq = core.add_request(f"c-{tenant}", follow_up, GREEDY, tenant)
        core.step()
        held[tenant] = set(seq.block_table)
    assert not held["t1"] & held["t2"]
    run_core(core)
    assert_no_block_held(core)


def test_mixed_finished_cancelled_and_preempted_requests_leak_nothing(
    tiny_model: LlamaForCausalLM,
) -> None:
    core = make_core(tiny_model, num_kv_blocks=20, max_batched_tokens=96, max_num_seqs=6)
    prompts = [random_prompt(20 + 13 * i, seed=40 + i) for i in range(8)]
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, SamplingParams(max_tokens=30 + 5 * i, ignore_eos=True))
    generated: dict[str, list[int]] = {}
    for step in range(25):
        for out in core.step():
            if out.token_id is not None:
                generated.setdefault(out.seq_id, []).append(out.token_id)
        if step == 5:
            core.abort("r1")
        if step == 12:
            core.abort("r6")
    for seq_id, ids in run_core(core).items():
        generated.setdefault(seq_id, []).extend(ids)
    assert core.scheduler.num_preemptions > 0
    for i in (0, 2, 7):
        assert generated[f"r{i}"] == hf_greedy(tiny_model, prompts[i], 30 + 5 * i)
    assert_no_block_held(core)


def test_stream_tokens_can_be_closed_and_frees_blocks_at_once(
    make_engine: Callable[..., PagedEngine],
) -> None:
    engine = make_engine()

    async def take_three_then_close() -> int:
        stream = engine.stream_tokens(random_prompt(50, 1), SamplingParams(max_tokens=1000))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        await stream.aclose()
        return seen

    assert asyncio.run(take_three_then_close()) == 3
    assert engine.call(lambda core: core.blocks.counts().used) == 0
    assert engine.call(lambda core: core.num_requests) == 0


def test_cancelling_the_consumer_task_aborts_the_request(
    make_engine: Callable[..., PagedEngine],
) -> None:
    engine = make_engine()

    async def consume(started: asyncio.Event) -> None:
        async for _ in engine.stream_tokens(random_prompt(20, 2), SamplingParams(max_tokens=2000)):
            started.set()

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(consume(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert engine.call(lambda core: (core.num_requests, core.blocks.counts().used)) == (0, 0)


def test_the_engine_decodes_on_while_its_consumer_is_busy(
    make_engine: Callable[..., PagedEngine],
) -> None:
    """Detokenizing, SSE framing and the output checks run on the consumer's side: an event
    loop held by them (here, by a sleep) never holds the engine thread's steps back."""
    engine = make_engine()
    answer_tokens = 48

    async def hold_the_loop_after_the_first_token() -> list[StepOutput]:
        stream = engine.stream_tokens(
            random_prompt(20, 4), SamplingParams(max_tokens=answer_tokens, ignore_eos=True)
        )
        outputs = [await anext(stream)]
        deadline = time.monotonic() + 60
        while engine.call(lambda core: core.num_requests) and time.monotonic() < deadline:
            time.sleep(0.01)  # blocks the loop, as a slow output check would
        assert engine.call(lambda core: core.num_requests) == 0, "the engine waited"
        outputs.extend([out async for out in stream])
        return outputs

    outputs = asyncio.run(hold_the_loop_after_the_first_token())
    assert [out.token_id is not None for out in outputs].count(True) == answer_tokens
    assert outputs[-1].finish_reason == "length"


def test_requests_beyond_the_context_window_are_refused(
    make_engine: Callable[..., PagedEngine],
) -> None:
    engine = make_engine()
    with pytest.raises(ContextLengthExceeded, match="maximum context length"):
        engine.generate([random_prompt(2000, 3)], SamplingParams(max_tokens=100))
    with pytest.raises(EngineError, match="empty"):
        engine.generate([[]], GREEDY)


def test_a_full_waiting_queue_raises_overloaded(make_engine: Callable[..., PagedEngine]) -> None:
    engine = make_engine(max_num_seqs=1, max_batched_tokens=8, max_waiting=1)

    async def main() -> None:
        params = SamplingParams(max_tokens=1000, ignore_eos=True)
        first = engine.stream_tokens(random_prompt(10, 1), params)
        second = engine.stream_tokens(random_prompt(10, 2), params)
        await first.__anext__()
        # Not iterated yet: submitting happens on first iteration.
        second_task = asyncio.ensure_future(second.__anext__())
        await asyncio.sleep(0.05)
        third = engine.stream_tokens(random_prompt(10, 3), params)
        with pytest.raises(EngineOverloaded):
            await third.__anext__()
        second_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second_task
        await first.aclose()

    asyncio.run(main())
    assert engine.call(lambda core: core.num_requests) == 0


def test_sampling_options(make_engine: Callable[..., PagedEngine]) -> None:
    engine = make_engine()
    prompt = random_prompt(30, 8)
    seeded = SamplingParams(max_tokens=20, temperature=1.0, top_k=20, top_p=0.9, seed=3)
    once, twice = engine.generate([prompt, prompt], seeded)
    assert token_ids(once) == token_ids(twice)
    greedy = token_ids(engine.generate([prompt], GREEDY)[0])
    stop_at = greedy[4]
    stopped = engine.generate([prompt], SamplingParams(max_tokens=12, stop_token_ids=(stop_at,)))
    assert token_ids(stopped[0]) == greedy[: greedy.index(stop_at)]
    assert stopped[0][-1].finish_reason == "stop"
    lengthy = engine.generate([prompt], SamplingParams(max_tokens=3))[0]
    assert lengthy[-1].finish_reason == "length"
    assert lengthy[-1].num_output_tokens == 3
    penalised = token_ids(
        engine.generate([prompt], SamplingParams(max_tokens=30, frequency_penalty=2.0))[0]
    )
    assert len(penalised) == 30
    assert max(penalised.count(t) for t in set(penalised)) <= max(
        greedy.count(t) for t in set(greedy)
    ) or len(set(penalised)) >= len(set(greedy))
    with_logprobs = engine.generate(
        [prompt], SamplingParams(max_tokens=4, logprobs=True, top_logprobs=3)
    )[0]
    for out in with_logprobs:
        assert isinstance(out, StepOutput)
        assert out.logprob is not None
        assert len(out.logprob.top) == 3
        assert out.logprob.top[0][0] == out.token_id  # greedy picks the most likely
        assert out.logprob.logprob == pytest.approx(out.logprob.top[0][1])
