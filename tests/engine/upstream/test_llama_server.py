"""`UpstreamEngine` against a real llama.cpp `llama-server` serving SmolLM2."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from engine import (
    ChatMessage,
    Constraint,
    ConstraintError,
    GenerationRequest,
    SamplingParams,
    UnsupportedParameter,
    UpstreamRejected,
    UpstreamUnavailable,
)
from tests.engine.upstream.conftest import (
    QUESTION,
    REFUSED_URL,
    ask,
    collect,
    open_engine,
    upstream_config,
)
from tests.support.llama_server import LlamaServer, running_llama_server, smollm2_gguf


def test_streams_an_answer_with_the_upstreams_usage_and_server(llama_server: LlamaServer) -> None:
    async def scenario() -> None:
        config = upstream_config(llama_server.base_url, tokenizer="upstream")
        async with open_engine(config) as engine:
            deltas = await collect(engine, ask(max_tokens=8, ignore_eos=True))
            exact = await engine.exact_prompt_tokens(QUESTION)
        *pieces, last = deltas
        assert len(pieces) >= 2 and all(d.text for d in pieces)
        assert [d.completion_tokens for d in pieces] == list(range(1, len(pieces) + 1))
        assert all(d.finish_reason is None for d in pieces)
        assert {d.served_by for d in deltas} == {llama_server.base_url}
        assert last.finish_reason == "length"
        assert last.completion_tokens == 8
        assert last.prompt_tokens == exact > 10
        assert last.served_by == llama_server.base_url

    asyncio.run(scenario())


def test_greedy_answers_repeat(llama_server: LlamaServer) -> None:
    async def scenario() -> list[str]:
        async with open_engine(upstream_config(llama_server.base_url)) as engine:
            return [
                "".join(d.text for d in await collect(engine, ask(max_tokens=12))) for _ in range(2)
            ]

    first, second = asyncio.run(scenario())
    assert first and first == second


def test_fails_over_past_a_url_that_refuses_connections(llama_server: LlamaServer) -> None:
    async def scenario() -> tuple[str, str]:
        config = upstream_config(REFUSED_URL, llama_server.base_url, max_retries=1)
        async with open_engine(config) as engine:
            first = (await collect(engine, ask()))[-1].served_by
            second = (await collect(engine, ask()))[-1].served_by
            return first, second

    assert asyncio.run(scenario()) == (llama_server.base_url, llama_server.base_url)


def test_every_url_refusing_is_a_503_with_retry_after() -> None:
    async def scenario() -> None:
        async with open_engine(upstream_config(REFUSED_URL, max_retries=1)) as engine:
            with pytest.raises(UpstreamUnavailable) as caught:
                await collect(engine, ask())
        assert caught.value.status == 503
        assert caught.value.upstream == REFUSED_URL
        assert caught.value.retry_after_s >= 1

    asyncio.run(scenario())


def test_a_raw_prompt_goes_to_completions(llama_server: LlamaServer) -> None:
    async def scenario() -> str:
        request = GenerationRequest(
            "r", (), SamplingParams(max_tokens=4), prompt="The capital of France is"
        )
        config = upstream_config(llama_server.base_url, tokenizer="upstream")
        async with open_engine(config) as engine:
            deltas = await collect(engine, request)
            assert deltas[-1].prompt_tokens == await engine.exact_text_tokens(request.prompt or "")
        return "".join(d.text for d in deltas)

    assert "Paris" in asyncio.run(scenario())


def test_logprobs_come_back_as_text(llama_server: LlamaServer) -> None:
    async def scenario() -> None:
        async with open_engine(upstream_config(llama_server.base_url)) as engine:
            deltas = await collect(engine, ask(max_tokens=4, logprobs=True, top_logprobs=2))
        entries = [entry for d in deltas for entry in d.logprobs]
        assert "".join(e.token for e in entries) == "".join(d.text for d in deltas)
        assert all(e.logprob <= 0 and len(e.top) == 2 for e in entries)
        assert entries[0].top[0] == (entries[0].token, entries[0].logprob)  # greedy

    asyncio.run(scenario())


def test_a_json_schema_is_forwarded_and_the_answer_parses(llama_server: LlamaServer) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    constraint = Constraint("json_schema", json.dumps(schema))

    async def scenario() -> str:
        async with open_engine(upstream_config(llama_server.base_url)) as engine:
            deltas = await collect(engine, ask(max_tokens=60, constraint=constraint))
        assert deltas[-1].finish_reason == "stop"
        return "".join(d.text for d in deltas)

    answer = json.loads(asyncio.run(scenario()))
    assert set(answer) == {"colour", "count"} and isinstance(answer["count"], int)


def test_logit_bias_and_grammars_are_refused_before_anything_is_sent() -> None:
    async def scenario() -> None:
        async with open_engine(upstream_config(REFUSED_URL)) as engine:
            with pytest.raises(UnsupportedParameter) as caught:
                await collect(engine, ask(logit_bias=((42, 5.0),)))
            assert caught.value.param == "logit_bias"
            with pytest.raises(ConstraintError, match="regex"):
                await collect(engine, ask(constraint=Constraint("regex", "[a-z]+")))

    asyncio.run(scenario())


def test_a_prompt_too_long_is_the_upstreams_400_not_a_502(llama_server: LlamaServer) -> None:
    long = GenerationRequest("r", (ChatMessage("user", "word " * 1500),))

    async def scenario() -> None:
        async with open_engine(upstream_config(llama_server.base_url, max_retries=2)) as engine:
            with pytest.raises(UpstreamRejected) as caught:
                await collect(engine, long)
            assert caught.value.status == 400
            assert "context" in str(caught.value)
            assert caught.value.upstream == llama_server.base_url
            # The server is fine: its circuit stays closed and it answers the next request.
            assert (await collect(engine, ask()))[-1].served_by == llama_server.base_url

    asyncio.run(scenario())


def test_the_context_window_and_token_counts_come_from_the_upstream(
    llama_server: LlamaServer,
) -> None:
    async def scenario() -> None:
        config = upstream_config(llama_server.base_url, tokenizer="upstream")
        async with open_engine(config) as engine:
            await engine.start()
            assert engine.context_window == 1024  # 2048 over two slots
            exact = await engine.exact_prompt_tokens(QUESTION)
            used = (await collect(engine, ask()))[-1].prompt_tokens
            assert exact == used
            assert engine.count_prompt_tokens(QUESTION) >= exact  # the estimate's margin
            assert await engine.exact_text_tokens("The capital of France is") == 5

    asyncio.run(scenario())


def test_a_local_gguf_tokenizer_counts_as_the_upstream_does(llama_server: LlamaServer) -> None:
    config = upstream_config(
        llama_server.base_url, tokenizer="local", tokenizer_path=smollm2_gguf()
    )

    async def scenario() -> None:
        async with open_engine(config) as engine:
            used = (await collect(engine, ask()))[-1].prompt_tokens
            assert engine.count_prompt_tokens(QUESTION) == used
            assert engine.vocab_size == 49152

    asyncio.run(scenario())


def test_closing_the_stream_aborts_the_upstream_generation(llama_server: LlamaServer) -> None:
    async def scenario() -> None:
        async with open_engine(upstream_config(llama_server.base_url)) as engine:
            stream = engine.stream(ask(max_tokens=400, ignore_eos=True))
            await anext(stream)
            await anext(stream)
            assert llama_server.busy_slots() == 1
            await stream.aclose()
        deadline = time.monotonic() + 3
        while llama_server.busy_slots() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert llama_server.busy_slots() == 0

    asyncio.run(scenario())


def test_an_upstream_killed_mid_stream_is_a_502_after_the_partial_text() -> None:
    with running_llama_server(context=512, parallel=1) as server:

        async def scenario() -> list[str]:
            texts: list[str] = []
            async with open_engine(upstream_config(server.base_url)) as engine:
                with pytest.raises(UpstreamUnavailable) as caught:
                    async for delta in engine.stream(ask(max_tokens=400, ignore_eos=True)):
                        texts.append(delta.text)
                        if len(texts) == 3:
                            server.kill()
            assert caught.value.status == 502
            assert caught.value.upstream == server.base_url
            return texts

        texts = asyncio.run(scenario())
    assert 3 <= len(texts) < 400 and all(texts)


def test_an_exact_count_asked_first_learns_the_servers_kind(llama_server: LlamaServer) -> None:
    async def scenario() -> tuple[int, int]:
        config = upstream_config(llama_server.base_url, tokenizer="upstream")
        async with open_engine(config) as engine:
            first = await engine.exact_prompt_tokens(QUESTION)  # before any health check
            used = (await collect(engine, ask()))[-1].prompt_tokens
            return first, used

    first, used = asyncio.run(scenario())
    assert first == used
