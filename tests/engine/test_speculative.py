"""Speculative decoding: prompt-lookup drafts, verification, and the output it must not change."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jsonschema
import pytest
import torch
from scipy.stats import chi2_contingency
from transformers import LlamaForCausalLM

from engine import (
    ChatMessage,
    Constraint,
    EngineConfig,
    GenerationRequest,
    PagedEngine,
    SamplingParams,
)
from engine.core import EngineCore
from engine.sampling import probabilities
from engine.spec_drafts import (
    LONGEST_DRAFT,
    SuffixAutomaton,
    SuffixDrafter,
    draft_length,
    longest_draft_for,
)
from engine.speculative import accept_draft
from engine.tokenization import encode_chat
from tests.engine.conftest import (
    assert_no_block_held,
    collect_deltas,
    make_core,
    random_prompt,
    run_core,
    tiny_llama,
)

GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


class OracleDrafter:
    """Drafts the known answer, spoiling one token of every third draft, so that steps
    accept whole drafts, parts of drafts and nothing."""

    def __init__(
        self,
        num_prompt_tokens: int,
        answer: Sequence[int],
        width: int = 5,
        spoil: Callable[[int], int] = lambda token: (token + 1) % 16,
    ) -> None:
        self.num_prompt_tokens = num_prompt_tokens
        self.answer = list(answer)
        self.width = width
        self.spoil = spoil
        self.proposals = 0
        self.accepted = 0
        self.limits: list[int] = []  # the longest draft the scheduler asked for, each step

    def propose(self, token_ids: Sequence[int], limit: int) -> list[int]:
        self.limits.append(limit)
        done = len(token_ids) - self.num_prompt_tokens
        draft = self.answer[done : done + min(self.width, limit)]
        self.proposals += 1
        if self.proposals % 3 == 0 and len(draft) > 1:
            draft[len(draft) // 2] = self.spoil(draft[len(draft) // 2])
        return draft

    def record(self, drafted: int, accepted: int) -> None:
        self.accepted += accepted


def reference(model: LlamaForCausalLM, prompts: list[list[int]], **config: Any) -> list[list[int]]:
    """Greedy answers without speculation, all prompts in one batch."""
    core = make_core(model, **config)
    for i, prompt in enumerate(prompts):
        core.add_request(str(i), prompt, GREEDY)
    out = run_core(core)
    return [out[str(i)] for i in range(len(prompts))]


def with_oracles(
    core: EngineCore,
    prompts: list[list[int]],
    answers: list[list[int]],
    params: SamplingParams = GREEDY,
) -> list[OracleDrafter]:
    oracles = []
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        seq = core.add_request(str(i), prompt, params)
        seq.drafter = oracle = OracleDrafter(len(prompt), answer)
        oracles.append(oracle)
    return oracles


# -- the draft proposer ---------------------------------------------------------------------


def test_drafter_proposes_what_followed_the_longest_earlier_match() -> None:
    source = [10, 11, 12, 13, 14, 15, 16]
    tokens = [1, 2, *source, 3, 4, 11, 12, 13]
    # "11 12 13" occurred before: what followed it, 3 tokens, or fewer if limited.
    assert draft_length(3) == 3
    assert SuffixDrafter(max_tokens=8).propose(tokens, limit=8) == [14, 15, 16]
    assert SuffixDrafter(max_tokens=8).propose(tokens, limit=2) == [14, 15]
    assert SuffixDrafter(max_tokens=2).propose(tokens, limit=8) == [14, 15]
    # A longer match wins over a more recent shorter one, past the 4-gram limit that
    # n-gram lookup had: "3 4 5 6" last continued with 8, "1 2 3 4 5 6" with 7.
    # A match of 6 drafts 5 tokens.
    tokens = [1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4, 5, 6, 8, 0, 1, 2, 3, 4, 5, 6]
    assert SuffixDrafter(max_tokens=8).propose(tokens, limit=8) == [7, 9, 2, 3, 4]
    # Of equally long matches the latest: "2 3" continued with 9, then with 8.
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 4, 2, 3]
    assert SuffixDrafter(max_tokens=8).propose(tokens, limit=8) == [8, 4, 2]
    # A one-token match drafts one token; a token never seen before drafts nothing.
    assert SuffixDrafter(max_tokens=8).propose([5, 9, 8, 5], limit=8) == [9]
    assert SuffixDrafter(max_tokens=8).propose([1, 2, 3, 4], limit=8) == []
    # The longer the match, the longer the draft: a match of 9 drafts 7.
    tokens = [*range(20), *range(9)]
    assert SuffixDrafter(max_tokens=8).propose(tokens, limit=8) == list(range(9, 16))
    assert [draft_length(n) for n in (1, 2, 3, 4, 7, 8, 50)] == [1, 3, 3, 5, 5, 7, 7]


def test_drafter_indexes_tokens_as_they_arrive() -> None:
    drafter = SuffixDrafter(max_tokens=8)
    tokens = [5, 6, 7, 8]
    assert drafter.propose(tokens, limit=4) == []
    tokens += [9, 5, 6]
    assert drafter.propose(tokens, limit=4) == [7, 8, 9]
    tokens += [7, 8, 9, 5, 6, 7]  # a match of 8: a long draft, cut at the limit
    assert drafter.propose(tokens, limit=4) == [8, 9, 5, 6]


def test_the_automaton_finds_the_longest_repeat_and_its_latest_end() -> None:
    """Against brute force, token by token, on random sequences over small vocabularies."""
    generator = torch.Generator().manual_seed(3)
    for vocab in (2, 3, 8):
        tokens = torch.randint(0, vocab, (200,), generator=generator).tolist()
        automaton = SuffixAutomaton()
        for n in range(1, len(tokens) + 1):
            automaton.extend(tokens[n - 1 : n])
            seen = tokens[:n]
            longest, end = 0, -1
            for length in range(1, n):
                suffix = seen[n - length :]
                ends = [
                    e for e in range(length - 1, n - 1) if seen[e - length + 1 : e + 1] == suffix
                ]
                if not ends:
                    break
                longest, end = length, ends[-1]
            assert automaton.longest_repeat() == (longest, end), (vocab, n)


def test_drafting_pauses_after_repeated_misses_and_resumes() -> None:
    drafter = SuffixDrafter(max_tokens=8)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    assert len(drafter.propose(tokens, limit=8)) == draft_length(2)
    for _ in range(7):
        drafter.record(3, 0)
    drafter.record(3, 1)  # an accepted token resets the count
    for _ in range(7):
        drafter.record(3, 0)
    assert drafter.propose(tokens, limit=8) != []
    drafter.record(3, 0)
    paused = [drafter.propose(tokens, limit=8) for _ in range(4)]
    assert paused == [[], [], [], []]
    assert drafter.propose(tokens, limit=8) != []
    for _ in range(8):
        drafter.record(1, 0)
    assert [drafter.propose(tokens, limit=8) for _ in range(8)] == [[]] * 8  # twice as long
    assert drafter.propose(tokens, limit=8) != []
    assert (drafter.proposed, drafter.accepted) == (3 * 16 + 8, 1)


def test_draft_length_follows_the_measured_acceptance() -> None:
    """A long match drafts the longest draft while drafts are kept; as they stop being kept
    the drafts shorten, and they lengthen again once tokens are kept."""
    drafter = SuffixDrafter(max_tokens=8)
    tokens = list(range(1, 13)) * 2  # the second copy repeats the first: a long match
    assert len(drafter.propose(tokens, limit=8)) == LONGEST_DRAFT
    lengths = []
    for _ in range(9):
        drafter.record(7, 1)  # one token of seven kept, each time: no pause, low acceptance
        lengths.append(len(drafter.propose(tokens, limit=8)))
    assert lengths[0] == LONGEST_DRAFT and lengths[-1] == 1
    assert lengths == sorted(lengths, reverse=True) and 3 in lengths
    assert drafter.acceptance < 0.25
    for _ in range(4):
        drafter.record(1, 1)
    assert len(drafter.propose(tokens, limit=8)) == LONGEST_DRAFT
    assert [longest_draft_for(a) for a in (1.0, 0.5, 0.49, 0.25, 0.1)] == [7, 7, 3, 3, 1]


# -- verification -----------------------------------------------------------------------------


def test_greedy_is_unchanged_alone_and_batched(tiny_model: LlamaForCausalLM) -> None:
    prompts = [random_prompt(n, seed=n) for n in (3, 16, 40, 90)]
    for weights in ("float", "int8"):
        expected = reference(tiny_model, prompts, weights=weights)
        alone = make_core(tiny_model, weights=weights, speculative_tokens=8)
        oracle = with_oracles(alone, prompts[2:3], expected[2:3])[0]
        assert run_core(alone)["0"] == expected[2]
        assert oracle.accepted > len(expected[2]) // 2  # most tokens came from drafts
        batched = make_core(
            tiny_model, weights=weights, speculative_tokens=8, speculative_max_batch=8
        )
        oracles = with_oracles(batched, prompts, expected)
        out = run_core(batched)
        assert [out[str(i)] for i in range(len(prompts))] == expected
        assert all(o.accepted > 0 for o in oracles)
        assert_no_block_held(batched)


def test_a_sequence_decoding_beside_another_drafts_one_token(
    tiny_model: LlamaForCausalLM,
) -> None:
    """Two three-token drafts would make a step of 8 rows, more than they save: beside
    another decode a draft is one token; alone, as long as the drafter wants."""
    prompts = [random_prompt(20, seed=s) for s in (4, 5)]
    expected = reference(tiny_model, prompts)
    short = SamplingParams(max_tokens=10, ignore_eos=True)
    core = make_core(tiny_model, speculative_tokens=8, speculative_max_batch=2)
    first = core.add_request("0", prompts[0], short)
    first.drafter = beside = OracleDrafter(len(prompts[0]), expected[0])
    second = core.add_request("1", prompts[1], GREEDY)
    second.drafter = alone = OracleDrafter(len(prompts[1]), expected[1])
    out = run_core(core)
    assert out == {"0": expected[0][:10], "1": expected[1]}
    # The last steps of the first ask for less: its answer ends (max_tokens).
    assert 1 in beside.limits and set(beside.limits) <= {0, 1}
    # The second drafted beside the first while it ran, then alone with longer drafts.
    assert set(alone.limits[: len(beside.limits)]) == {1}
    assert alone.limits[len(beside.limits)] > 1
    assert alone.accepted > len(expected[1]) // 2


def test_no_sequence_drafts_while_more_run_than_the_drafting_bound(
    tiny_model: LlamaForCausalLM,
) -> None:
    """With three answers running and drafting bounded at two, a step verifies no draft,
    where at three they draft; the answers are the same either way."""
    prompts = [random_prompt(20, seed=s) for s in (6, 7, 8)]
    expected = reference(tiny_model, prompts)
    for bound, drafts in ((2, False), (3, True)):
        core = make_core(tiny_model, speculative_tokens=8, speculative_max_batch=bound)
        oracles = []
        for i, prompt in enumerate(prompts):
            seq = core.add_request(str(i), prompt, GREEDY)
            seq.drafter = oracle = OracleDrafter(len(prompt), expected[i])
            oracles.append(oracle)
        out = run_core(core)
        assert [out[str(i)] for i in range(len(prompts))] == expected
        assert any(o.proposals for o in oracles) == drafts, bound
        assert_no_block_held(core)


def test_natural_drafts_keep_greedy_output(tiny_model: LlamaForCausalLM) -> None:
    """The suffix drafter itself, on prompts that repeat themselves."""
    prompts = [random_prompt(12, seed=s) * 4 for s in (1, 2)]
    expected = reference(tiny_model, prompts)
    core = make_core(tiny_model, speculative_tokens=8)
    seqs = [core.add_request(str(i), p, GREEDY) for i, p in enumerate(prompts)]
    out = run_core(core)
    assert [out[str(i)] for i in range(len(prompts))] == expected
    assert sum(s.drafter.proposed for s in seqs if isinstance(s.drafter, SuffixDrafter)) > 0


def test_greedy_is_unchanged_with_a_warm_prefix_cache(tiny_model: LlamaForCausalLM) -> None:
    shared = random_prompt(64, seed=7)
    prompts = [shared + random_prompt(n, seed=70 + n) for n in (5, 21)]
    expected = reference(tiny_model, prompts)
    core = make_core(tiny_model, speculative_tokens=8)
    with_oracles(core, prompts, expected)
    run_core(core)  # warms the cache with prompts and answers
    hits = core.blocks.prefix_hits
    with_oracles(core, prompts, expected)
    out = run_core(core)
    assert core.blocks.prefix_hits > hits
    assert [out[str(i)] for i in range(len(prompts))] == expected
    # The cache only ever holds accepted tokens: a third run that hits the answers' blocks
    # (the prompt extended by the answer) still continues exactly.
    longer = prompts[0] + expected[0][:32]
    want = reference(tiny_model, [longer])[0]
    with_oracles(core, [longer], [want])
    assert run_core(core)["0"] == want
    assert_no_block_held(core)


def test_greedy_is_unchanged_after_preemption(tiny_model: LlamaForCausalLM) -> None:
    prompts = [random_prompt(30 + 7 * i, seed=40 + i) for i in range(4)]
    expected = reference(tiny_model, prompts)
    core = make_core(
        tiny_model,
        speculative_tokens=8,
        speculative_max_batch=8,
        num_kv_blocks=12,
        max_batched_tokens=64,
    )
    oracles = with_oracles(core, prompts, expected)
    out = run_core(core)
    assert core.scheduler.num_preemptions > 0
    assert all(o.accepted > 0 for o in oracles)
    assert [out[str(i)] for i in range(len(prompts))] == expected
    assert_no_block_held(core)


def test_stop_tokens_and_max_tokens_cut_where_they_do_without_drafts(
    tiny_model: LlamaForCausalLM,
) -> None:
    prompt = random_prompt(25, seed=5)
    (answer,) = reference(tiny_model, [prompt])
    stop_at = answer[9]
    stopping = SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=(stop_at,))
    core = make_core(tiny_model, speculative_tokens=8)
    with_oracles(core, [prompt], [answer], stopping)
    outs = []
    while core.has_work:
        outs += core.step()
    assert [o.token_id for o in outs if o.token_id is not None] == answer[: answer.index(stop_at)]
    assert outs[-1].finish_reason == "stop"
    for max_tokens in (1, 2, 7):
        short = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        core = make_core(tiny_model, speculative_tokens=8)
        with_oracles(core, [prompt], [answer], short)
        outs = []
        while core.has_work:
            outs += core.step()
        assert [o.token_id for o in outs] == answer[:max_tokens]
        assert outs[-1].finish_reason == "length"
        assert outs[-1].num_output_tokens == max_tokens
        assert_no_block_held(core)


def test_penalties_and_logprobs_match_decoding_one_token_at_a_time(
    tiny_model: LlamaForCausalLM,
) -> None:
    prompt = random_prompt(20, seed=9)
    params = SamplingParams(
        max_tokens=24, ignore_eos=True, frequency_penalty=1.5, logprobs=True, top_logprobs=2
    )
    plain = make_core(tiny_model)
    plain.add_request("0", prompt, params)
    want = []
    while plain.has_work:
        want += plain.step()
    core = make_core(tiny_model, speculative_tokens=8)
    with_oracles(core, [prompt], [[o.token_id or 0 for o in want]], params)
    got = []
    while core.has_work:
        got += core.step()
    assert [o.token_id for o in got] == [o.token_id for o in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprob is not None and b.logprob is not None
        assert a.logprob.logprob == pytest.approx(b.logprob.logprob, abs=1e-4)
        assert [t for t, _ in a.logprob.top] == [t for t, _ in b.logprob.top]


def test_speculation_is_on_where_the_config_and_the_request_allow_it(
    tiny_model: LlamaForCausalLM,
) -> None:
    core = make_core(tiny_model, speculative_tokens=8)
    free = core.add_request("free", random_prompt(10, 1), GREEDY)
    assert free.drafter is not None
    off = core.add_request("off", random_prompt(10, 2), SamplingParams(speculative=False))
    assert off.drafter is None
    # A constrained answer drafts too (tests/engine/test_constrained_speculation.py); the
    # grammar, any object here, is only stored.
    constrained = core.add_request("json", random_prompt(10, 3), GREEDY, grammar=object())  # type: ignore[arg-type]
    assert constrained.drafter is not None
    assert make_core(tiny_model).add_request("x", [1, 2], GREEDY).drafter is None


# -- sampling -------------------------------------------------------------------------------


def test_rejection_sampling_keeps_the_distribution_of_each_position() -> None:
    """accept_draft's first two tokens against the target distributions themselves."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0], [0.0, 1.5, 1.5, -0.5, 0.3], [1.0] * 5])
    params = SamplingParams(temperature=0.8, top_k=4)
    draft = [1, 2]  # a likely and an unlikely token, each accepted only sometimes
    # The second position is reached about 0.19 of the time: 20,000 trials give it about
    # 3,700 samples, an expected total variation near 0.01 against the bound of 0.03 (with
    # 6,000 the bound was about two standard deviations away, and a change of the random
    # draws alone could cross it).
    trials = 20000
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    generator = torch.Generator().manual_seed(0)
    for _ in range(trials):
        tokens = [t for t, _ in accept_draft(logits.clone(), draft, params, [], generator)]
        first[tokens[0]] += 1
        if tokens[0] == draft[0]:
            second[tokens[1]] += 1
    for counts, row in ((first, 0), (second, 1)):
        target = probabilities(logits[row], params)
        total = sum(counts.values())
        observed = torch.tensor([counts[t] / total for t in range(5)], dtype=torch.float64)
        assert 0.5 * (observed - target).abs().sum() < 0.03  # total variation
        assert counts[int(target.argmin())] == 0  # top-k left this token out


def test_sampled_answers_keep_their_distribution_in_the_engine() -> None:
    """Token frequencies at the first positions over many seeds, with and without drafts
    (the greedy answer, often what is sampled): a chi-square test of homogeneity must not
    tell them apart."""
    model = tiny_llama(seed=3, vocab_size=16)
    prompt = [1, 2, 3, 4, 5, 6] * 4
    (greedy,) = reference(model, [prompt])
    seeds = range(600)
    positions = (1, 2, 3)

    def frequencies(drafts: bool) -> tuple[list[Counter[int]], int]:
        core = make_core(model, speculative_tokens=8, speculative_max_batch=1000, max_num_seqs=256)
        oracles = []
        for seed in seeds:
            params = SamplingParams(max_tokens=4, temperature=1.0, seed=seed, ignore_eos=True)
            seq = core.add_request(str(seed), prompt, params)
            seq.drafter = OracleDrafter(len(prompt), greedy, width=3) if drafts else None
            oracles.append(seq.drafter)
        out = run_core(core)
        accepted = sum(o.accepted for o in oracles if o is not None)
        return [Counter(out[str(s)][p] for s in seeds) for p in positions], accepted

    without, _ = frequencies(False)
    with_drafts, accepted = frequencies(True)
    assert accepted > 100  # the drafts were really used
    for a, b in zip(without, with_drafts, strict=True):
        tokens = sorted(set(a) | set(b))
        table = [[a[t] + 0.5 for t in tokens], [b[t] + 0.5 for t in tokens]]
        assert chi2_contingency(table).pvalue > 1e-3


# -- SmolLM2 ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_engine(smollm2: tuple[Any, Any]) -> Any:
    model, tokenizer = smollm2
    config = EngineConfig(weights="auto", speculative_tokens=8, kv_cache_mb=64)
    engine = PagedEngine.from_hf_model(model, tokenizer, "smollm2", "cpu", config=config)
    yield engine
    engine.close()


SOURCE = (
    "Remote access to the office network goes through the WireGuard VPN. Install the "
    "WireGuard client from the company software center, then import the configuration file "
    "that the IT helpdesk sends you by encrypted email."
)
# SmolLM2-135M paraphrases a source it is asked about; asked to repeat it, it copies.
# "Word for word" gives the copy's first token a clear lead (1.0 in logprob): without it,
# "To" came within a bf16 step of "Remote", and the second request, whose prompt's last
# token runs on the int8 decode path after a prefix-cache hit, could start otherwise.
RAG = (ChatMessage("user", f"Repeat this text exactly, word for word:\n\n{SOURCE}"),)


def test_smollm2_rag_answer_is_unchanged_and_mostly_drafted(int8_engine: PagedEngine) -> None:
    def answer(speculative: bool, **options: Any) -> list[Any]:
        params = SamplingParams(max_tokens=64, speculative=speculative, **options)
        return collect_deltas(int8_engine, GenerationRequest("r", RAG, params))

    # The drafts are verified by the native int8 step (one row per draft position).
    assert int8_engine.call(lambda core: core.runner.native is not None)
    plain = answer(False)
    assert int8_engine.metrics().draft_tokens == 0
    fast = answer(True)
    metrics = int8_engine.metrics()
    # Most of the answer came from drafts.
    assert metrics.accepted_draft_tokens > plain[-1].completion_tokens // 2
    text = "".join(d.text for d in plain)
    assert "".join(d.text for d in fast) == text
    assert "WireGuard" in text
    # A stop string and logprobs: cut at the same place, the same tokens reported.
    word = text.split()[6]
    stopped = [answer(s, stop=(word,), logprobs=True) for s in (False, True)]
    texts = ["".join(d.text for d in deltas) for deltas in stopped]
    assert texts[0] == texts[1] and word not in texts[0]
    tokens = [[lp.token for d in deltas for lp in d.logprobs] for deltas in stopped]
    assert tokens[0] == tokens[1]


QUOTE = {
    "type": "object",
    "properties": {"quote": {"type": "string", "maxLength": 400}},
    "required": ["quote"],
    "additionalProperties": False,
}


def test_smollm2_schema_answer_quoting_its_prompt_is_drafted_and_unchanged(
    int8_engine: PagedEngine, smollm2: tuple[Any, Any]
) -> None:
    """Drafts of a constrained answer: cut where the schema forbids a token, masked at each
    position, and taken from the prompt as a free answer's are."""
    tokenizer = smollm2[1]
    prompt = encode_chat(tokenizer, RAG)
    constraint = Constraint("json_schema", json.dumps(QUOTE))

    def answer(speculative: bool) -> list[int]:
        params = SamplingParams(max_tokens=96, constraint=constraint, speculative=speculative)
        # Salted apart: each run computes the whole prompt, as the other did.
        (outs,) = int8_engine.generate([prompt], params, cache_salts=[str(speculative)])
        assert outs[-1].finish_reason == "stop"
        return [o.token_id for o in outs if o.token_id is not None]

    def accepted() -> int:
        # Read on the engine thread: the snapshot may lag an earlier test's last request.
        return int(int8_engine.call(lambda core: core.metrics().accepted_draft_tokens))

    drafted = accepted()
    plain = answer(False)
    assert accepted() == drafted
    fast = answer(True)
    assert fast == plain
    text = tokenizer.decode(plain, clean_up_tokenization_spaces=False)
    jsonschema.validate(json.loads(text), QUOTE)
    assert "WireGuard" in json.loads(text)["quote"]
    # Most of the answer came from drafts of the prompt.
    assert accepted() - drafted > len(plain) // 2
