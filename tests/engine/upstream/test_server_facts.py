"""What the servers of a model say of themselves (context window, `/tokenize`) comes from
one that answers: the next URL when the first is down, another when the first goes away."""

from __future__ import annotations

import asyncio

from engine import UpstreamEngine
from tests.engine.upstream.conftest import QUESTION, REFUSED_URL, open_engine, upstream_config
from tests.engine.upstream.fault_server import fault_server


def test_the_context_window_comes_from_the_next_url_when_the_first_is_down() -> None:
    async def scenario() -> int:
        async with (
            fault_server("stream", context_window=1536) as second,
            open_engine(upstream_config(REFUSED_URL, second.base_url)) as engine,
        ):
            await engine.start()
            return engine.context_window

    assert asyncio.run(scenario()) == 1536


async def wait_for_window(engine: UpstreamEngine, window: int) -> None:
    async with asyncio.timeout(5):
        while engine.context_window != window:
            await asyncio.sleep(0.02)


def test_the_context_window_follows_the_servers_that_answer() -> None:
    """The smallest of those that answer (a request may reach any of them); a server that
    stops answering no longer counts, and counts again once it is back."""

    async def scenario() -> None:
        async with (
            fault_server("stream", context_window=1024) as first,
            fault_server("stream", context_window=2048) as second,
        ):
            config = upstream_config(first.base_url, second.base_url, health_interval_s=0.05)
            async with open_engine(config) as engine:
                await engine.start()
                await wait_for_window(engine, 1024)
                first.healthy = False
                await wait_for_window(engine, 2048)
                first.healthy = True
                await wait_for_window(engine, 1024)
                second.healthy = first.healthy = False  # none answers: the last one said
                await asyncio.sleep(0.2)
                assert engine.context_window in (1024, 2048)

    asyncio.run(scenario())


def test_tokens_are_counted_by_the_next_url_when_the_first_cannot_be_reached() -> None:
    async def scenario() -> None:
        async with fault_server("stream", tokens=22) as second:
            async with fault_server("stream", tokens=11) as first:
                config = upstream_config(first.base_url, second.base_url, tokenizer="upstream")
                engine = UpstreamEngine(config)
                await engine.start()
                assert await engine.exact_prompt_tokens(QUESTION) == 11
            try:  # the first server is gone: its listener is closed
                assert await engine.exact_prompt_tokens(QUESTION) == 22
                assert await engine.exact_text_tokens("Hi") == 22
            finally:
                await engine.aclose()
            assert (first.tokenized, second.tokenized) == (1, 2)

    asyncio.run(scenario())


def test_a_server_without_tokenize_is_not_asked_again() -> None:
    async def scenario() -> None:
        async with fault_server("stream", tokens=None) as missing:
            config = upstream_config(missing.base_url, tokenizer="upstream")
            async with open_engine(config) as engine:
                first = await engine.exact_prompt_tokens(QUESTION)
                assert await engine.exact_prompt_tokens(QUESTION) == first
            assert missing.tokenized == 1

    asyncio.run(scenario())
