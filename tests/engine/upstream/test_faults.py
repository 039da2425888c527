"""`UpstreamEngine` against upstreams that fail: hung, stalled, malformed, overloaded, slow."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from engine import GenerationRequest, SamplingParams, UpstreamTimeouts, UpstreamUnavailable
from tests.engine.upstream.conftest import QUESTION, ask, collect, open_engine, upstream_config
from tests.engine.upstream.fault_server import fault_server
from tests.support.llama_server import LlamaServer

SHORT = UpstreamTimeouts(connect=1.0, first_token=0.5, idle=0.5, total=10.0)


def test_a_hung_upstream_is_a_504_within_the_first_token_timeout() -> None:
    async def scenario() -> None:
        async with fault_server("hang") as hung:
            config = upstream_config(hung.base_url, timeouts=SHORT, max_retries=0)
            async with open_engine(config) as engine:
                started = time.monotonic()
                with pytest.raises(UpstreamUnavailable) as caught:
                    await collect(engine, ask())
                elapsed = time.monotonic() - started
            await asyncio.wait_for(hung.client_closed.wait(), 1)
        assert caught.value.status == 504
        assert 0.5 <= elapsed < 2.0  # first_token, not first_token per retry

    asyncio.run(scenario())


def test_a_hung_first_url_fails_over_to_the_next(llama_server: LlamaServer) -> None:
    async def scenario() -> str:
        async with fault_server("hang") as hung:
            config = upstream_config(hung.base_url, llama_server.base_url, timeouts=SHORT)
            async with open_engine(config) as engine:
                return (await collect(engine, ask()))[-1].served_by

    assert asyncio.run(scenario()) == llama_server.base_url


def test_a_stall_after_the_headers_is_a_504_and_not_retried() -> None:
    async def scenario() -> None:
        async with fault_server("stall") as stalled:
            config = upstream_config(stalled.base_url, timeouts=SHORT, max_retries=2)
            async with open_engine(config) as engine:
                with pytest.raises(UpstreamUnavailable) as caught:
                    await collect(engine, ask())
            assert caught.value.status == 504
            assert stalled.posts == 1  # bytes came back: the upstream may be generating

    asyncio.run(scenario())


def test_malformed_sse_is_a_502_and_not_retried() -> None:
    async def scenario() -> None:
        async with fault_server("garbage") as garbled:
            config = upstream_config(garbled.base_url, max_retries=2)
            async with open_engine(config) as engine:
                with pytest.raises(UpstreamUnavailable, match="malformed") as caught:
                    await collect(engine, ask())
            assert caught.value.status == 502
            assert garbled.posts == 1

    asyncio.run(scenario())


def test_an_error_event_mid_stream_is_a_502_after_the_text() -> None:
    async def scenario() -> None:
        async with fault_server("error_mid_stream", chunks=2) as failing:
            async with open_engine(upstream_config(failing.base_url)) as engine:
                texts: list[str] = []
                with pytest.raises(UpstreamUnavailable, match="crashed") as caught:
                    async for delta in engine.stream(ask()):
                        texts.append(delta.text)
            assert texts == ["w0 ", "w1 "]
            assert caught.value.status == 502

    asyncio.run(scenario())


def test_a_503_upstream_is_retried_then_a_502() -> None:
    async def scenario() -> None:
        async with fault_server("status_503") as busy:
            config = upstream_config(busy.base_url, max_retries=2)
            async with open_engine(config) as engine:
                with pytest.raises(UpstreamUnavailable, match="overloaded") as caught:
                    await collect(engine, ask())
            assert caught.value.status == 502
            assert busy.posts == 3

    asyncio.run(scenario())


def test_the_circuit_opens_after_repeated_failures_and_recovers() -> None:
    async def scenario() -> None:
        async with fault_server("status_503") as flaky:
            config = upstream_config(
                flaky.base_url, max_retries=0, circuit_failures=2, circuit_reset_s=0.3
            )
            async with open_engine(config) as engine:
                for _ in range(2):
                    with pytest.raises(UpstreamUnavailable):
                        await collect(engine, ask())
                with pytest.raises(UpstreamUnavailable, match="circuit open") as caught:
                    await collect(engine, ask())
                assert caught.value.status == 503 and caught.value.retry_after_s > 0
                assert flaky.posts == 2  # the open circuit sent nothing

                await asyncio.sleep(0.35)
                with pytest.raises(UpstreamUnavailable):  # the trial fails: open again
                    await collect(engine, ask())
                with pytest.raises(UpstreamUnavailable, match="circuit open"):
                    await collect(engine, ask())
                assert flaky.posts == 3

                flaky.mode = "stream"
                await asyncio.sleep(0.35)
                assert (await collect(engine, ask()))[-1].served_by == flaky.base_url
                assert (await collect(engine, ask()))[-1].finish_reason == "stop"
                assert flaky.posts == 5

    asyncio.run(scenario())


def test_closing_the_stream_closes_the_upstream_connection() -> None:
    async def scenario() -> None:
        async with (
            fault_server("stream", chunks=50, chunk_delay_s=0.05) as slow,
            open_engine(upstream_config(slow.base_url)) as engine,
        ):
            stream = engine.stream(ask())
            assert (await anext(stream)).text == "w0 "
            await stream.aclose()
            await asyncio.wait_for(slow.client_closed.wait(), 1)

    asyncio.run(scenario())


def test_the_concurrency_cap_holds_requests_to_one_url() -> None:
    async def scenario() -> None:
        async with fault_server("stream", chunks=3, chunk_delay_s=0.05) as slow:
            config = upstream_config(slow.base_url, max_concurrency=2)
            async with open_engine(config) as engine:
                answers = await asyncio.gather(*(collect(engine, ask()) for _ in range(5)))
            assert all(a[-1].completion_tokens == 3 and a[-1].prompt_tokens == 7 for a in answers)
            assert slow.posts == 5
            assert slow.max_active == 2

    asyncio.run(scenario())


def test_the_request_body_carries_what_is_forwarded() -> None:
    sampling = SamplingParams(
        max_tokens=5, temperature=0.7, top_p=0.9, seed=3, top_k=20, stop=("END",),
        presence_penalty=0.5,
    )  # fmt: skip

    async def scenario() -> None:
        async with fault_server("stream") as recorder:
            salted = upstream_config(recorder.base_url, forward_cache_salt=True)
            async with open_engine(salted) as engine:
                await collect(engine, GenerationRequest("r", QUESTION, sampling, cache_salt="a"))
            async with open_engine(upstream_config(recorder.base_url)) as engine:
                await collect(engine, GenerationRequest("r", QUESTION, cache_salt="b"))
        body, unsalted = recorder.bodies
        assert body["model"] == "smollm2" and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["messages"] == [{"role": "user", "content": "Name three colours."}]
        assert (body["max_tokens"], body["temperature"], body["top_p"]) == (5, 0.7, 0.9)
        assert (body["seed"], body["top_k"], body["stop"]) == (3, 20, ["END"])
        assert body["presence_penalty"] == 0.5 and "frequency_penalty" not in body
        assert body["cache_salt"] == "a"
        assert "cache_salt" not in unsalted

    asyncio.run(scenario())


def test_a_stream_that_goes_quiet_is_a_504_after_its_text() -> None:
    async def scenario() -> None:
        async with fault_server("stream", chunks=3, chunk_delay_s=0.8) as quiet:
            async with open_engine(upstream_config(quiet.base_url, timeouts=SHORT)) as engine:
                texts: list[str] = []
                with pytest.raises(UpstreamUnavailable, match="timed out mid-answer") as caught:
                    async for delta in engine.stream(ask()):
                        texts.append(delta.text)
            assert texts == ["w0 "]
            assert caught.value.status == 504

    asyncio.run(scenario())


def test_requests_go_to_a_healthy_url_before_an_unhealthy_one() -> None:
    async def scenario() -> None:
        async with (
            fault_server("stream", healthy=False) as sick,
            fault_server("stream") as well,
        ):
            config = upstream_config(sick.base_url, well.base_url, health_interval_s=0.1)
            async with open_engine(config) as engine:
                await engine.start()
                assert (await collect(engine, ask()))[-1].served_by == well.base_url
                sick.healthy = True
                await asyncio.sleep(0.3)
                assert (await collect(engine, ask()))[-1].served_by == sick.base_url
            assert (sick.posts, well.posts) == (1, 1)

    asyncio.run(scenario())


def test_closing_the_engine_lets_streams_in_flight_finish_and_refuses_new_ones() -> None:
    async def scenario() -> None:
        async with (
            fault_server("stream", chunks=4, chunk_delay_s=0.05) as slow,
            open_engine(upstream_config(slow.base_url)) as engine,
        ):
            stream = engine.stream(ask())
            texts = [(await anext(stream)).text]
            engine.close()  # as a hot reload does, on the loop
            texts += [delta.text async for delta in stream]
            assert texts == ["w0 ", "w1 ", "w2 ", "w3 ", ""]
            with pytest.raises(UpstreamUnavailable, match="closed") as caught:
                await collect(engine, ask())
            assert caught.value.status == 503

    asyncio.run(scenario())


def test_a_client_leaving_before_the_first_token_closes_the_upstream_connection() -> None:
    async def scenario() -> None:
        async with (
            fault_server("hang") as hung,
            open_engine(upstream_config(hung.base_url)) as engine,
        ):
            waiting = asyncio.create_task(collect(engine, ask()))
            while not hung.posts:
                await asyncio.sleep(0.01)
            waiting.cancel()
            await asyncio.wait_for(hung.client_closed.wait(), 1)
            with pytest.raises(asyncio.CancelledError):
                await waiting

    asyncio.run(scenario())


# A key mounted from a Secret file keeps the file's newline.
@pytest.mark.parametrize("value", ["sk-upstream-123", "sk-upstream-123\n"])
def test_the_key_is_sent_as_a_bearer_token(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TEST_UPSTREAM_KEY", value)

    async def scenario() -> None:
        async with fault_server("stream") as recorder:
            config = upstream_config(recorder.base_url, api_key_env="TEST_UPSTREAM_KEY")
            async with open_engine(config) as engine:
                await collect(engine, ask())
            assert recorder.authorizations == ["Bearer sk-upstream-123"]

    asyncio.run(scenario())


def test_a_reset_mid_answer_is_a_502_that_names_the_error() -> None:
    async def scenario() -> None:
        async with fault_server("reset_mid_stream") as resetting:
            config = upstream_config(resetting.base_url, max_retries=0)
            async with open_engine(config) as engine:
                with pytest.raises(UpstreamUnavailable) as caught:
                    await collect(engine, ask())
        assert caught.value.status == 502
        # The reset itself, as the socket reported it.
        assert "ReadError: ConnectionResetError: [Errno 104]" in str(caught.value)

    asyncio.run(scenario())


def test_streams_one_after_another_share_a_kept_connection() -> None:
    """The body's end after `[DONE]` is read, so the connection goes back to the pool (a
    TCP, and over https a TLS, handshake spared per request)."""

    async def scenario() -> None:
        async with fault_server("kept") as server:
            config = upstream_config(server.base_url, health_interval_s=60)
            async with open_engine(config) as engine:
                await engine.start()
                for _ in range(5):
                    texts = [delta.text for delta in await collect(engine, ask())]
                    assert texts == ["kept", ""]
            assert server.posts == 5
            assert server.connections <= 2  # the health checks' may be another

    asyncio.run(scenario())


@contextmanager
def listener_that_never_accepts() -> Iterator[str]:
    """A port whose accept queue is full: the kernel drops further connection attempts, so
    a client's connect hangs as it does towards a host that is down."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for filler in fillers:
            filler.close()
        server.close()


def test_a_connection_not_accepted_in_time_is_a_504_after_the_connect_timeout() -> None:
    timeouts = UpstreamTimeouts(connect=0.3, first_token=5.0, idle=5.0, total=10.0)

    async def scenario(base_url: str) -> tuple[UpstreamUnavailable, float]:
        config = upstream_config(base_url, timeouts=timeouts, max_retries=0)
        async with open_engine(config) as engine:
            started = time.monotonic()
            with pytest.raises(UpstreamUnavailable) as caught:
                await collect(engine, ask())
            return caught.value, time.monotonic() - started

    with listener_that_never_accepts() as base_url:
        error, elapsed = asyncio.run(scenario(base_url))
    assert error.status == 504 and "did not accept the connection in time" in str(error)
    assert elapsed < 2.0  # the connect timeout, not the first token's


def test_an_answer_past_the_total_timeout_is_a_504_after_its_text() -> None:
    """Each piece comes within the idle timeout; the whole answer may not take longer than
    `total`."""
    timeouts = UpstreamTimeouts(connect=1.0, first_token=1.0, idle=1.0, total=1.5)

    async def scenario() -> None:
        async with fault_server("stream", chunks=20, chunk_delay_s=0.3) as slow:
            config = upstream_config(slow.base_url, timeouts=timeouts)
            async with open_engine(config) as engine:
                texts: list[str] = []
                started = time.monotonic()
                with pytest.raises(UpstreamUnavailable) as caught:
                    async for delta in engine.stream(ask(max_tokens=64)):
                        texts.append(delta.text)
                elapsed = time.monotonic() - started
        assert caught.value.status == 504
        assert 2 <= len(texts) < 20
        assert 1.5 <= elapsed < 2.5

    asyncio.run(scenario())
