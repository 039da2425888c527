"""Speculative decoding under a grammar: drafts are cut where the grammar forbids a token,
each verified position is masked for the grammar's state after the draft before it, and
the answer is token for token the one decoding without drafts gives. Also, with drafts and
without, a grammar's end under ignore_eos."""

from __future__ import annotations

import re

import pytest
import torch
import xgrammar as xgr
from transformers import LlamaForCausalLM

from engine import SamplingParams
from engine.core import EngineCore, StepOutput
from engine.grammar import GrammarRows, GrammarState, fill_masks
from tests.engine.conftest import VOCAB, assert_no_block_held, make_core, random_prompt, run_core
from tests.engine.test_speculative import OracleDrafter

STOP = 1
# 48 letters a to h: of the tiny vocabulary's 512 tokens, 64 spell only those; the answer
# ends only after the last letter, 24 to 48 tokens in.
PATTERN = "[a-h]{48}"
CONSTRAINED = SamplingParams(max_tokens=64, stop_token_ids=(STOP,))
FREE = SamplingParams(max_tokens=40, ignore_eos=True)


def _letters(index: int) -> str:
    """`index` in base 26 with a for 0: "a".."z", "ba".."zz", ...; a different text each."""
    text = chr(97 + index % 26)
    while index >= 26:
        index //= 26
        text = chr(97 + index % 26) + text
    return text


# The tiny models' vocabulary as text, so that a grammar allows some tokens and not others.
TEXTS = ["<s>", "</s>", *(_letters(i) for i in range(VOCAB - 2))]
LETTER = {text: token for token, text in enumerate(TEXTS)}


@pytest.fixture(scope="module")
def compiled() -> xgr.CompiledGrammar:
    info = xgr.TokenizerInfo(TEXTS, vocab_size=VOCAB, stop_token_ids=[STOP])
    return xgr.GrammarCompiler(info, max_threads=1).compile_regex(PATTERN)


def _state(compiled: xgr.CompiledGrammar) -> GrammarState:
    return GrammarState(compiled, [STOP], VOCAB)


def _tokens(text: str) -> list[int]:
    return [LETTER[letter] for letter in text]


def _run(
    core: EngineCore,
    compiled: xgr.CompiledGrammar,
    prompts: list[list[int]],
    answers: list[list[int]] | None = None,
    constrained: tuple[bool, ...] = (True,),
) -> tuple[list[list[int]], list[OracleDrafter]]:
    """Each prompt's greedy answer, constrained to PATTERN where `constrained` says; with
    `answers`, each sequence drafts its known answer, every third draft with another
    token in its middle (one the grammar allows where the answer is a letter)."""
    oracles = []
    for i, (prompt, grammar) in enumerate(zip(prompts, constrained, strict=True)):
        params = CONSTRAINED if grammar else FREE
        seq = core.add_request(
            str(i), prompt, params, grammar=_state(compiled) if grammar else None
        )
        if answers is not None:
            seq.drafter = oracle = OracleDrafter(len(prompt), answers[i], spoil=_other_letter)
            oracles.append(oracle)
    out = run_core(core)
    assert_no_block_held(core)
    return [out[str(i)] for i in range(len(prompts))], oracles


def _other_letter(token: int) -> int:
    return LETTER["a"] if token != LETTER["a"] else LETTER["b"]


def _text(answer: list[int]) -> str:
    return "".join(TEXTS[token] for token in answer)


# -- the grammar's side ---------------------------------------------------------------------


def test_a_draft_is_cut_at_the_first_token_the_grammar_forbids(
    compiled: xgr.CompiledGrammar,
) -> None:
    state = _state(compiled)
    assert state.allowed_prefix(_tokens("abcd") + _tokens("z") + _tokens("ab")) == _tokens("abcd")
    assert state.allowed_prefix(_tokens("x")) == []
    # Up to the grammar's end: 48 letters, its stop token, and nothing after it.
    full = _tokens("a" * 48)
    assert state.allowed_prefix([*full, STOP, *_tokens("a")]) == [*full, STOP]
    assert state.allowed_prefix(_tokens("a" * 49)) == full
    # A draft leaves the state as it was: the grammar still starts from scratch.
    assert state.allowed_prefix([STOP]) == []
    assert state.accept(LETTER["h"]) and not state.accept(STOP)


def test_each_draft_position_is_masked_for_the_state_after_the_draft_before_it(
    compiled: xgr.CompiledGrammar,
) -> None:
    state = _state(compiled)
    prefix, draft = _tokens("a" * 45), (LETTER["b"], LETTER["ch"], STOP)
    for token in prefix:
        assert state.accept(token)
    masks = fill_masks(6, [GrammarRows(2, state, draft)])
    allowed = [set(torch.nonzero(row == 0).flatten().tolist()) for row in masks]
    assert allowed[0] == allowed[1] == allowed[5] == set(range(VOCAB))  # other sequences
    letters = {token for token, text in enumerate(TEXTS) if re.fullmatch("[a-h]+", text)}
    assert len(letters) == 64
    # After 45 letters and after 46 one or two more may follow; after 48 only the end.
    assert allowed[2] == allowed[3] == letters
    assert allowed[4] == {STOP}
    # The row after the draft's stop token is left open: the answer ends with that token.
    assert state.allowed_prefix(list(draft)) == list(draft)  # the matcher was rolled back
    assert state.accept(LETTER["h"])


# -- the engine's side ----------------------------------------------------------------------


def test_constrained_greedy_answers_are_unchanged_by_drafts(
    tiny_model: LlamaForCausalLM, compiled: xgr.CompiledGrammar
) -> None:
    prompts = [random_prompt(n, seed=n) for n in (5, 30)]
    for prompt in prompts:
        (expected,), _ = _run(make_core(tiny_model), compiled, [prompt])
        assert re.fullmatch(PATTERN, _text(expected))
        core = make_core(tiny_model, speculative_tokens=8)
        (answer,), (oracle,) = _run(core, compiled, [prompt], [expected])
        assert answer == expected
        assert oracle.accepted > len(expected) // 2  # most tokens came from drafts
        assert core.metrics().draft_tokens > core.metrics().accepted_draft_tokens


def test_constrained_and_free_answers_drafting_together_are_unchanged(
    tiny_model: LlamaForCausalLM, compiled: xgr.CompiledGrammar
) -> None:
    prompts = [random_prompt(12, seed=21), random_prompt(17, seed=22)]
    expected = [
        _run(make_core(tiny_model), compiled, [prompt], constrained=(grammar,))[0][0]
        for prompt, grammar in zip(prompts, (True, False), strict=True)
    ]
    core = make_core(tiny_model, speculative_tokens=8, speculative_max_batch=8)
    answers, oracles = _run(core, compiled, prompts, expected, (True, False))
    assert answers == expected
    assert all(oracle.accepted > 0 for oracle in oracles)
    assert re.fullmatch(PATTERN, _text(answers[0]))


def test_sampled_constrained_answers_with_drafts_follow_the_grammar(
    tiny_model: LlamaForCausalLM, compiled: xgr.CompiledGrammar
) -> None:
    """Rejection sampling against masked rows: every answer valid, drafts still accepted."""
    prompt = random_prompt(14, seed=8)
    (greedy,), _ = _run(make_core(tiny_model), compiled, [prompt])
    core = make_core(tiny_model, speculative_tokens=8, speculative_max_batch=8)
    oracles = []
    for seed in range(6):
        params = SamplingParams(max_tokens=64, temperature=0.7, seed=seed, stop_token_ids=(STOP,))
        seq = core.add_request(str(seed), prompt, params, grammar=_state(compiled))
        seq.drafter = oracle = OracleDrafter(len(prompt), greedy, spoil=_other_letter)
        oracles.append(oracle)
    out = run_core(core)
    assert all(re.fullmatch(PATTERN, _text(out[str(seed)])) for seed in range(6))
    assert sum(oracle.accepted for oracle in oracles) > 0
    assert_no_block_held(core)


def test_drafts_the_grammar_forbids_never_reach_the_model(
    tiny_model: LlamaForCausalLM, compiled: xgr.CompiledGrammar
) -> None:
    """A drafter that proposes only forbidden tokens: no draft is verified."""
    prompt = random_prompt(9, seed=3)
    (expected,), _ = _run(make_core(tiny_model), compiled, [prompt])
    core = make_core(tiny_model, speculative_tokens=8)
    wrong = [LETTER["z"]] * len(expected)
    (answer,), _ = _run(core, compiled, [prompt], [wrong])
    assert answer == expected
    assert core.metrics().draft_tokens == 0


# -- a grammar's end under ignore_eos -------------------------------------------------------

PROMPT, FREE_PROMPT = random_prompt(10, seed=31), random_prompt(13, seed=32)


def _outputs(core: EngineCore) -> dict[str, list[StepOutput]]:
    """Every output of each sequence, stepping until idle."""
    outputs: dict[str, list[StepOutput]] = {}
    while core.has_work:
        for out in core.step():
            outputs.setdefault(out.seq_id, []).append(out)
    assert_no_block_held(core)
    return outputs


@pytest.mark.parametrize("speculative", [False, True], ids=["decode", "speculative"])
def test_a_grammar_that_ends_finishes_its_answer_despite_ignore_eos(
    tiny_model: LlamaForCausalLM, compiled: xgr.CompiledGrammar, speculative: bool
) -> None:
    """ignore_eos keeps a free answer going past the stop token; a grammar that accepted
    it allows no more text, so the constrained answer ends there, as it does without
    ignore_eos, and the free answer batched with it runs on unchanged."""
    (alone,), _ = _run(make_core(tiny_model), compiled, [PROMPT])
    free_core = make_core(tiny_model)
    free_core.add_request("free", FREE_PROMPT, FREE)
    free_alone = run_core(free_core)["free"]

    core = make_core(tiny_model, speculative_tokens=8 if speculative else 0)
    core.stop_token_ids = frozenset({STOP})  # the model's EOS is the grammar's stop token
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    seq = core.add_request("constrained", PROMPT, params, grammar=_state(compiled))
    if speculative:  # drafts that run into the stop token, to verify rows after it
        seq.drafter = OracleDrafter(len(PROMPT), [*alone, STOP, *alone], spoil=_other_letter)
    core.add_request("free", FREE_PROMPT, FREE)
    outputs = _outputs(core)

    constrained, free = outputs["constrained"], outputs["free"]
    answer = [o.token_id for o in constrained if o.token_id is not None]
    assert answer == alone
    assert re.fullmatch(PATTERN, _text(answer))
    assert constrained[-1].finish_reason == "stop"
    assert [o.token_id for o in free] == free_alone
    assert free[-1].finish_reason == "length"
    if speculative:
        assert core.metrics().accepted_draft_tokens > 0
