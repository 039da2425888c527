"""Step durations by kind: histogram counts the engine hands to `/metrics`."""

from __future__ import annotations

import pytest
from transformers import LlamaForCausalLM

from engine import SamplingParams
from engine.step_times import STEP_SECONDS_BUCKETS, StepTimes
from tests.engine.conftest import make_core, random_prompt


def test_counts_are_cumulative_and_a_bound_holds_its_own_value() -> None:
    times = StepTimes()
    times.observe("decode", 0.004)
    times.observe("decode", STEP_SECONDS_BUCKETS[1])  # on a bound: counted at that bound
    times.observe("decode", 60.0)  # past the last bound: in the count and sum only
    times.observe("prefill", 0.3)
    decode, prefill = times.snapshot()["decode"], times.snapshot()["prefill"]
    assert decode.buckets[:3] == (1, 2, 2)
    assert decode.buckets[-1] == 2
    assert decode.count == 3
    assert decode.sum_s == pytest.approx(0.004 + STEP_SECONDS_BUCKETS[1] + 60.0)
    index = STEP_SECONDS_BUCKETS.index(0.5)
    assert prefill.buckets[index - 1] == 0
    assert prefill.buckets[index:] == (1,) * (len(STEP_SECONDS_BUCKETS) - index)
    assert prefill.count == 1


def test_a_step_that_computes_prompt_tokens_counts_as_prefill(
    tiny_model: LlamaForCausalLM,
) -> None:
    core = make_core(tiny_model, kv_cache_mb=8, speculative_tokens=0)
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    core.add_request("a", random_prompt(6, seed=1), params)
    core.step()  # a's prompt
    core.step()  # a decodes
    core.add_request("b", random_prompt(9, seed=2), params)
    core.step()  # a decodes beside b's prompt: a prefill step
    while core.has_work:
        core.step()
    steps = core.metrics().step_seconds
    assert steps["prefill"].count == 2
    # a's 2nd token, then a's 4th and 5th beside b's 2nd and 3rd, then b's 4th and 5th.
    assert steps["decode"].count == 5
    assert core.metrics().steps == 7
    for histogram in steps.values():
        assert histogram.sum_s > 0
        assert histogram.buckets[-1] <= histogram.count
