"""Every chat-completion parameter Bastion accepts changes the answer as OpenAI's does;
the others are refused with a 400 that names them (docs/api.md has the table)."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.integration.conftest import LiveServer

QUESTION = [{"role": "user", "content": "List the days of the week."}]


def _ask(client: OpenAI, **params: Any) -> Any:
    return client.chat.completions.create(model="", messages=QUESTION, **params)  # type: ignore[arg-type]


def test_logprobs_in_the_whole_answer(client: OpenAI) -> None:
    response = _ask(client, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert "".join(entry.token for entry in content) == response.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and math.isfinite(entry.logprob)
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.bytes == list(entry.token.encode())
    plain = _ask(client, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None


def test_logprobs_in_streamed_chunks(client: OpenAI) -> None:
    whole = _ask(client, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
    stream = _ask(client, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2, stream=True)
    streamed = [
        entry
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content or []
    ]
    expected = whole.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in expected]
    assert [round(e.logprob, 3) for e in streamed] == [round(e.logprob, 3) for e in expected]


def test_frequency_penalty_changes_a_repetitive_answer(client: OpenAI) -> None:
    params = {"max_tokens": 60, "temperature": 0}
    plain = _ask(client, **params).choices[0].message.content
    penalised = _ask(client, frequency_penalty=2.0, **params).choices[0].message.content
    present = _ask(client, presence_penalty=2.0, **params).choices[0].message.content
    assert penalised != plain and present != plain
    # Days of the week repeat "day"; a strong penalty makes it rarer.
    assert penalised.count("day") < plain.count("day")


def test_logit_bias_bans_and_forces_tokens(client: OpenAI, live_server: LiveServer) -> None:
    plain = _ask(client, max_tokens=3, temperature=0, logprobs=True)
    first = plain.choices[0].logprobs.content[0].token
    tokenizer = live_server.engine._inner._tokenizer
    first_id = tokenizer.encode(first, add_special_tokens=False)[0]
    banned = _ask(
        client, max_tokens=3, temperature=0, logprobs=True, logit_bias={str(first_id): -100}
    )
    assert banned.choices[0].logprobs.content[0].token != first
    banana = tokenizer.encode(" banana", add_special_tokens=False)[0]
    forced = _ask(client, max_tokens=3, temperature=0, logit_bias={str(banana): 100})
    assert forced.choices[0].message.content.count("banana") == 3
    with pytest.raises(openai.BadRequestError) as refused:
        _ask(client, max_tokens=3, logit_bias={"99999999": 5})
    assert refused.value.body["param"] == "logit_bias"  # type: ignore[index]


def test_n_choices_share_the_prompt_and_seeds_repeat(
    client: OpenAI, live_server: LiveServer
) -> None:
    before = live_server.engine.metrics().prefix_cache_hit_tokens
    response = _ask(client, n=3, max_tokens=12, temperature=1.0, seed=11)
    assert [c.index for c in response.choices] == [0, 1, 2]
    texts = [c.message.content for c in response.choices]
    assert len(set(texts)) > 1  # each choice has its own seed
    again = _ask(client, n=3, max_tokens=12, temperature=1.0, seed=11)
    assert [c.message.content for c in again.choices] == texts
    assert response.usage.completion_tokens > 12  # the choices' tokens, not one choice's
    assert live_server.engine.metrics().prefix_cache_hit_tokens > before
    with pytest.raises(openai.BadRequestError) as too_many:
        _ask(client, n=50, max_tokens=2)
    assert too_many.value.body["param"] == "n"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as streamed:
        _ask(client, n=2, max_tokens=2, stream=True)
    assert streamed.value.body["param"] == "n"  # type: ignore[index]


def test_seed_and_stop_are_honoured(client: OpenAI) -> None:
    first = _ask(client, max_tokens=16, temperature=1.0, seed=5).choices[0].message.content
    second = _ask(client, max_tokens=16, temperature=1.0, seed=5).choices[0].message.content
    assert first == second
    greedy = _ask(client, max_tokens=30, temperature=0).choices[0].message.content
    word = greedy.split()[2]
    stopped = _ask(client, max_tokens=30, temperature=0, stop=[word])
    assert stopped.choices[0].message.content == greedy[: greedy.index(word)]
    assert stopped.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
        ("function_call", "auto"),
        ("audio", {"voice": "alloy", "format": "mp3"}),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}),
        ("reasoning_effort", "high"),
        ("verbosity", "low"),
        ("service_tier", "priority"),
        ("no_such_parameter", 1),
    ],
)
def test_parameters_bastion_does_not_honour_are_refused_by_name(
    client: OpenAI, param: str, value: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        _ask(client, max_tokens=2, extra_body={param: value})
    assert refused.value.body["param"] == param  # type: ignore[index]
    assert param in refused.value.body["message"]  # type: ignore[index]


def test_parameters_that_change_nothing_are_accepted(client: OpenAI) -> None:
    response = _ask(
        client,
        max_tokens=2,
        store=False,
        metadata={"team": "support"},
        extra_body={"prompt_cache_key": "k", "safety_identifier": "u1"},
    )
    assert response.choices[0].finish_reason in ("stop", "length")


def test_inconsistent_parameters_are_refused_by_name(client: OpenAI) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"modalities": ["audio"]}, "modalities.0"),
    ]
    for params, name in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            _ask(client, max_tokens=2, **params)
        assert refused.value.body["param"] == name  # type: ignore[index]
