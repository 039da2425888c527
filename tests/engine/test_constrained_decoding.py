"""Grammar-constrained decoding on the real SmolLM2 weights, in every path a sequence takes:
the native int8 decode step and the PyTorch one, mixed prefill/decode steps, prefix-cache
hits and preemption by recompute."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import jsonschema
import pytest

from engine import (
    ChatMessage,
    Constraint,
    ConstraintError,
    EngineConfig,
    EngineError,
    GenerationRequest,
    PagedEngine,
    SamplingParams,
    default_model_source,
)
from engine.core import StepOutput
from engine.grammar import Grammars
from engine.model_runner import ModelRunner
from engine.tokenization import encode_chat
from tests.engine.conftest import collect_deltas, needs_compiler

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "rivers": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "population", "rivers"],
    "additionalProperties": False,
}
QUESTIONS = [
    "Describe Paris as JSON with its name, population and rivers.",
    "Describe Rome as JSON with its name, population and rivers.",
    "Describe a small town of your choice as JSON.",
]


def _engine(smollm2: tuple[Any, Any], **config: Any) -> PagedEngine:
    model, tokenizer = smollm2
    return PagedEngine.from_hf_model(
        model, tokenizer, default_model_source().model_id, "cpu", config=EngineConfig(**config)
    )


@pytest.fixture(scope="module")
def native_engine(smollm2: tuple[Any, Any]) -> Iterator[PagedEngine]:
    """The serving configuration: int8 weights through the native decode step."""
    engine = _engine(smollm2, weights="auto")
    yield engine
    engine.close()


def _prompts(tokenizer: Any, questions: Sequence[str]) -> list[list[int]]:
    return [encode_chat(tokenizer, [ChatMessage("user", q)]) for q in questions]


def _texts(tokenizer: Any, results: list[list[StepOutput]]) -> list[str]:
    return [
        tokenizer.decode(
            [o.token_id for o in outs if o.token_id is not None],
            clean_up_tokenization_spaces=False,
        )
        for outs in results
    ]


def _schema_params(**overrides: Any) -> SamplingParams:
    constraint = Constraint("json_schema", json.dumps(CITY))
    return SamplingParams(max_tokens=120, constraint=constraint, **overrides)


def _assert_valid(text: str) -> None:
    jsonschema.validate(json.loads(text), CITY)
    assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)


@needs_compiler
def test_native_int8_answers_follow_the_schema_and_repeat_exactly(
    native_engine: PagedEngine, smollm2: tuple[Any, Any]
) -> None:
    tokenizer = smollm2[1]
    assert native_engine._core.runner.native is not None
    prompts = _prompts(tokenizer, QUESTIONS)
    first = native_engine.generate(prompts, _schema_params())
    second = native_engine.generate(prompts, _schema_params())
    for outs in first:
        assert outs[-1].finish_reason == "stop"
    texts = _texts(tokenizer, first)
    for text in texts:
        _assert_valid(text)
    assert texts == _texts(tokenizer, second)  # greedy under a constraint is deterministic
    # The second run found the prompts in the prefix cache and answered the same.
    assert native_engine.metrics().prefix_cache_hit_tokens > 0


def test_pytorch_path_mixed_steps_and_preemption_keep_answers_valid(
    smollm2: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small pool forces preemption; long and short prompts mix prefill chunks with
    decodes. The matcher keeps its state through the recompute, so each answer is the one
    it is when it runs alone."""
    tokenizer = smollm2[1]
    long_question = "Here is some context about cities. " * 10 + QUESTIONS[0]
    more = ["Describe Berlin as JSON.", "Describe Madrid as JSON."]
    prompts = _prompts(tokenizer, [*QUESTIONS, *more, long_question])
    alone = _engine(smollm2, native_decode=False)
    try:
        expected = [_texts(tokenizer, alone.generate([p], _schema_params()))[0] for p in prompts]
    finally:
        alone.close()
    steps: list[tuple[int, int]] = []  # (decodes, prefill chunks) of each step
    run_model = ModelRunner.run_model

    def record(runner: ModelRunner, ids: Any, positions: Any, ctx: Any, *rest: Any) -> Any:
        steps.append((ctx.num_decodes, len(ctx.prefills)))
        return run_model(runner, ids, positions, ctx, *rest)

    monkeypatch.setattr(ModelRunner, "run_model", record)
    crowded = _engine(
        smollm2, native_decode=False, num_kv_blocks=16, block_size=16, max_batched_tokens=64
    )
    try:
        results = crowded.generate(prompts, _schema_params())
        assert crowded._core.scheduler.num_preemptions > 0
        assert any(decodes and chunks for decodes, chunks in steps)  # mixed steps ran
    finally:
        crowded.close()
    texts = _texts(tokenizer, results)
    for text in texts:
        _assert_valid(text)
    assert texts == expected


@needs_compiler
def test_free_text_beside_constrained_answers_is_unchanged(
    native_engine: PagedEngine, smollm2: tuple[Any, Any]
) -> None:
    tokenizer = smollm2[1]
    free = _prompts(tokenizer, ["List the days of the week."])[0]
    plain = SamplingParams(max_tokens=30)
    # Salted apart, so neither run reuses blocks another test or run cached: a prefix-cache
    # hit computes the prompt's tail on its own, which can tip a close greedy choice.
    alone = _texts(tokenizer, native_engine.generate([free], plain, cache_salts=["alone"]))[0]
    prompts = [free, *_prompts(tokenizer, QUESTIONS)]
    params = [plain, *[_schema_params()] * len(QUESTIONS)]
    mixed = native_engine.generate(prompts, params, cache_salts=["mixed"] * len(prompts))
    assert _texts(tokenizer, mixed)[0] == alone


@needs_compiler
def test_sampled_answers_follow_the_schema(
    native_engine: PagedEngine, smollm2: tuple[Any, Any]
) -> None:
    tokenizer = smollm2[1]
    prompts = _prompts(tokenizer, QUESTIONS)
    for seed in (1, 2, 3):
        results = native_engine.generate(prompts, _schema_params(temperature=1.0, seed=seed))
        for outs, text in zip(results, _texts(tokenizer, results), strict=True):
            if outs[-1].finish_reason == "stop":
                _assert_valid(text)


@needs_compiler
def test_regex_and_grammar_constraints_through_the_chat_stream(
    native_engine: PagedEngine,
) -> None:
    question = (ChatMessage("user", "What is the date of the French revolution?"),)
    date = Constraint("regex", r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
    deltas = collect_deltas(
        native_engine,
        GenerationRequest("d", question, SamplingParams(max_tokens=20, constraint=date)),
    )
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "".join(d.text for d in deltas))
    assert deltas[-1].finish_reason == "stop"
    answer = Constraint("grammar", 'root ::= "yes" | "no"')
    yes_no = collect_deltas(
        native_engine,
        GenerationRequest("g", question, SamplingParams(max_tokens=5, constraint=answer)),
    )
    assert "".join(d.text for d in yes_no) in {"yes", "no"}


@needs_compiler
def test_a_cut_answer_says_length(native_engine: PagedEngine) -> None:
    question = (ChatMessage("user", QUESTIONS[0]),)
    params = SamplingParams(max_tokens=5, constraint=Constraint("json_schema", json.dumps(CITY)))
    deltas = collect_deltas(native_engine, GenerationRequest("l", question, params))
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].completion_tokens == 5


@needs_compiler
def test_logprobs_under_a_constraint_list_only_allowed_tokens(
    native_engine: PagedEngine,
) -> None:
    question = (ChatMessage("user", "Is water wet?"),)
    answer = Constraint("grammar", 'root ::= "yes" | "no"')
    params = SamplingParams(max_tokens=5, constraint=answer, logprobs=True, top_logprobs=5)
    deltas = collect_deltas(native_engine, GenerationRequest("p", question, params))
    first = next(lp for d in deltas for lp in d.logprobs)
    assert first.token in {"yes", "no", "y", "n", "ye"}
    assert all(token.strip() and value <= 0 for token, value in first.top)
    assert all("yes".startswith(t) or "no".startswith(t) for t, _ in first.top)


@needs_compiler
def test_invalid_constraints_are_refused_before_any_token(native_engine: PagedEngine) -> None:
    question = (ChatMessage("user", "Hi"),)
    for bad in (Constraint("json_schema", "{not json"), Constraint("grammar", "root ::= (")):
        request = GenerationRequest("x", question, SamplingParams(max_tokens=5, constraint=bad))
        with pytest.raises(ConstraintError):
            collect_deltas(native_engine, request)


def test_compiled_grammars_are_cached_in_a_bounded_lru(smollm2: tuple[Any, Any]) -> None:
    tokenizer = smollm2[1]
    grammars = Grammars(tokenizer, 49152, [2], cache_size=2)
    a, b, c = (Constraint("regex", pattern) for pattern in ("a+", "b+", "c+"))
    grammars.compile(a)
    grammars.compile(b)
    grammars.compile(a)  # a is the most recent now
    assert grammars.compiles == 2
    grammars.compile(c)  # evicts b, the least recently used
    assert grammars.cached(a) and grammars.cached(c) and not grammars.cached(b)


@needs_compiler
def test_logit_bias_forces_and_forbids_tokens(
    native_engine: PagedEngine, smollm2: tuple[Any, Any]
) -> None:
    tokenizer = smollm2[1]
    prompt = _prompts(tokenizer, ["List the days of the week."])[0]
    plain = native_engine.generate([prompt], SamplingParams(max_tokens=4))[0]
    first = plain[0].token_id
    assert first is not None
    banned = native_engine.generate(
        [prompt], SamplingParams(max_tokens=4, logit_bias=((first, -100.0),))
    )[0]
    assert banned[0].token_id != first
    forced_id = tokenizer.encode(" banana", add_special_tokens=False)[0]
    forced = native_engine.generate(
        [prompt], SamplingParams(max_tokens=3, logit_bias=((forced_id, 100.0),))
    )[0]
    assert [o.token_id for o in forced] == [forced_id] * 3


def test_a_compile_waits_for_the_one_before_it_only_so_long(smollm2: tuple[Any, Any]) -> None:
    """A compile cannot be interrupted, so they run one at a time: a runaway one holds a
    single core, and the requests behind it are refused instead of piling up."""
    grammars = Grammars(smollm2[1], 49152, [2])
    # A compile in progress holds the compiler.
    with grammars._compiling, pytest.raises(ConstraintError, match="still compiling"):
        grammars.compile(Constraint("regex", "[a-z]+"), wait_s=0.05)
    assert grammars.compile(Constraint("regex", "[a-z]+"), wait_s=0.05) is not None


def test_logit_bias_outside_the_vocabulary_is_refused(native_engine: PagedEngine) -> None:
    question = (ChatMessage("user", "Hi"),)
    params = SamplingParams(max_tokens=2, logit_bias=((10**9, 1.0),))
    with pytest.raises(EngineError, match="outside the vocabulary"):
        collect_deltas(native_engine, GenerationRequest("v", question, params))


@pytest.mark.parametrize("character", ["\t", "\x01", "\x1f"])
def test_schema_strings_refuse_raw_control_characters(
    smollm2: tuple[Any, Any], character: str
) -> None:
    """JSON allows control characters in a string only escaped; xgrammar's strings with a
    maxLength let them in raw (a sampled tab once made an answer that did not parse)."""
    tokenizer = smollm2[1]
    grammars = Grammars(tokenizer, 49152, [2])
    compiled = grammars.compile(Constraint("json_schema", json.dumps(CITY)))

    def accepts(text: str) -> bool:
        state = grammars.state(compiled)
        return all(state.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert accepts('{"name":"Lisboa é","population":5,"rivers":["Tejo')
    assert not accepts(f'{{"name":"Lis{character}')
    assert not accepts(f'{{"name":"Lisboa","population":5,"rivers":["Te{character}')
