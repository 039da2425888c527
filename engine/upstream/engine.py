"""`UpstreamEngine`: the `Engine` protocol over OpenAI-compatible servers.

A request goes to the first healthy URL whose circuit is closed; a failure before the first
token that is safe to repeat (refused, reset, a 502/503/504, no byte before the timeout)
is retried on the next URL, `max_retries` times at most. After the first token nothing is
retried: a failure then raises `UpstreamUnavailable` from the iterator, after the text
already yielded. Errors:

    EngineError
    ├── UnsupportedParameter   logit_bias / stop ids (local ids), before anything is sent
    ├── ConstraintError        regex, grammar, structural tag: no portable form upstream
    ├── UpstreamRejected       the upstream's 4xx and its message (400 to the client)
    └── UpstreamUnavailable    503 refused or circuit open (retry_after_s), 504 timed out,
                               502 malformed, a 5xx after retries, or died mid-stream
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Sequence

import structlog

from engine.types import (
    ChatMessage,
    GenerationRequest,
    TextLogprob,
    TokenDelta,
    UpstreamRejected,
    UpstreamUnavailable,
)
from engine.upstream.config import UpstreamConfig
from engine.upstream.endpoints import Endpoint, EndpointPool
from engine.upstream.health import check_health, watch_health
from engine.upstream.http_client import HTTPClient, HTTPError, StatusError, TransportError
from engine.upstream.loop_resources import LoopResources
from engine.upstream.request_body import UpstreamRequest, upstream_request
from engine.upstream.server_info import ServerInfo, read_server_info
from engine.upstream.stream_call import AttemptFailed, StreamCall, describe, open_stream
from engine.upstream.token_count import (
    LocalTokenizer,
    estimate_prompt_tokens,
    estimate_text_tokens,
    upstream_prompt_tokens,
    upstream_text_tokens,
)

log = structlog.get_logger(__name__)

# When neither the config nor the upstream says: the smallest window of the models such
# a gateway fronts, so that a context check never admits more than the server takes.
DEFAULT_CONTEXT_WINDOW = 4096
# The pause before trying a URL that already failed this request, times the attempt.
RETRY_BACKOFF_S = 0.05


class UpstreamEngine:
    """One model (`config.model_id`) served by the upstream servers of `config`."""

    def __init__(self, config: UpstreamConfig) -> None:
        if not config.base_urls:
            raise ValueError(f"model {config.model_id!r} has no upstream base_urls")
        self._config = config
        self._pool = EndpointPool.from_config(config)
        self._headers = _auth_headers(config.api_key_env)
        self._local = (
            LocalTokenizer(config.tokenizer_path)
            if config.tokenizer == "local" and config.tokenizer_path is not None
            else None
        )
        if config.tokenizer == "local" and self._local is None:
            raise ValueError(f"model {config.model_id!r}: tokenizer local needs tokenizer_path")
        # The window last said, for when no server has its facts (all down at once).
        self._last_window: int | None = None
        self._state: LoopResources | None = None
        self._closed = False
        self._tokenize_missing = False

    # -- the Engine protocol --------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self._config.model_id

    @property
    def context_window(self) -> int:
        """The config's value, else the smallest the servers that answer said (each read
        at `start`, its first health check or the first request, and again when it comes
        back), else the last one said, else DEFAULT_CONTEXT_WINDOW."""
        if self._config.context_window is not None:
            return self._config.context_window
        return self._pool.context_window() or self._last_window or DEFAULT_CONTEXT_WINDOW

    @property
    def vocab_size(self) -> int:
        """The local tokenizer's size, else 0: this engine refuses `logit_bias` whatever
        the ids (`UnsupportedParameter`), so no id is valid."""
        return self._local.vocab_size if self._local is not None else 0

    def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Exact with a local tokenizer, else the estimate (no network on the caller's
        loop); `exact_prompt_tokens` asks the upstream."""
        if self._local is not None:
            return self._local.count_prompt(messages)
        return estimate_prompt_tokens(messages)

    def count_text_tokens(self, text: str) -> int:
        if self._local is not None:
            return self._local.count_text(text)
        return estimate_text_tokens(text)

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[TokenDelta, None]:
        upstream = upstream_request(self._config, request)
        state = await self._loop_state()
        state.begin_stream()
        try:
            call, endpoint = await self._open(state, upstream)
            try:
                async for chunk in call.chunks():
                    yield self._delta(call, chunk.text, chunk.logprobs)
                yield self._delta(call, "", (), last=True)
            except UpstreamUnavailable:
                endpoint.breaker.record_failure()
                raise
            finally:
                # Closing an unread response drops the connection: the upstream aborts.
                await call.aclose()
                endpoint.slots.release()
        finally:
            await state.end_stream()

    def close(self) -> None:
        """Stops the health checks; the connections close once the streams in flight end.
        A closed engine takes no new request."""
        self._closed = True
        state, self._state = self._state, None
        if state is not None:
            state.shut_soon()

    # -- beyond the protocol --------------------------------------------------------------

    async def aclose(self) -> None:
        """`close`, awaited on the engine's loop (the client closes before it returns when
        no stream is in flight)."""
        self._closed = True
        state, self._state = self._state, None
        if state is not None:
            await state.shut()

    async def start(self) -> None:
        """Starts the health checks on the running loop and reads the server's facts from
        the first URL that answers (so that `context_window` holds the upstream's before
        the first request is checked against it); the first request starts the checks when
        nobody called this."""
        await self._loop_state()
        for endpoint in self._pool.endpoints:
            if endpoint.info is not None or (await self._check(endpoint) and endpoint.info):
                return

    async def exact_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """The upstream's own count (`/tokenize`) with `tokenizer: upstream`, else the
        synchronous count; the estimate when the upstream cannot be asked."""
        if self._config.tokenizer != "upstream":
            return self.count_prompt_tokens(messages)
        return await self._ask_upstream(estimate_prompt_tokens(messages), messages=messages)

    async def exact_text_tokens(self, text: str) -> int:
        """As `exact_prompt_tokens`, for a raw prompt."""
        if self._config.tokenizer != "upstream":
            return self.count_text_tokens(text)
        return await self._ask_upstream(estimate_text_tokens(text), text=text)

    @property
    def base_urls(self) -> tuple[str, ...]:
        return tuple(e.url for e in self._pool.endpoints)

    # -- internals ------------------------------------------------------------------------

    async def _open(
        self, state: LoopResources, upstream: UpstreamRequest
    ) -> tuple[StreamCall, Endpoint]:
        """An open stream on the first endpoint that answers, holding one of its slots."""
        tried: set[str] = set()
        failure: AttemptFailed | None = None
        last_url = self._pool.endpoints[0].url
        for attempt in range(1 + self._config.max_retries):
            endpoint = self._pool.next_endpoint(tried)
            if endpoint is None:
                raise UpstreamUnavailable(
                    f"Every upstream server of {self.model_id} is failing (circuit open).",
                    status=503,
                    upstream=last_url,
                    retry_after_s=self._pool.retry_after_s(),
                )
            if endpoint.url in tried:  # every URL failed once: give the servers a moment
                await asyncio.sleep(RETRY_BACKOFF_S * attempt)
            tried.add(endpoint.url)
            last_url = endpoint.url
            await self._acquire_slot(endpoint)
            endpoint.breaker.begin()
            try:
                call = await open_stream(
                    state.client, endpoint.url, upstream, self._headers, self._config.timeouts
                )
            except AttemptFailed as exc:
                endpoint.slots.release()
                endpoint.breaker.record_failure()
                failure = exc
                log.warning(
                    "upstream_attempt_failed",
                    model=self.model_id,
                    upstream=endpoint.url,
                    reason=str(exc),
                    retryable=exc.retryable,
                )
                if not exc.retryable:
                    break
            except UpstreamRejected:
                endpoint.slots.release()
                endpoint.breaker.record_success()  # the server works; the request was wrong
                raise
            except BaseException:
                endpoint.slots.release()
                endpoint.breaker.release()
                raise
            else:
                endpoint.breaker.record_success()
                return call, endpoint
        raise self._unavailable(failure, last_url)

    def _unavailable(self, failure: AttemptFailed | None, upstream: str) -> UpstreamUnavailable:
        """The error after the last attempt failed."""
        if failure is None:  # max_retries < 0: a config error, no attempt was made
            return UpstreamUnavailable("No attempt was allowed.", status=503, upstream=upstream)
        return UpstreamUnavailable(
            f"The upstream server {failure}.",
            status=failure.status,
            upstream=upstream,
            retry_after_s=self._pool.retry_after_s() if failure.status == 503 else 1.0,
        )

    async def _acquire_slot(self, endpoint: Endpoint) -> None:
        """One of the endpoint's `max_concurrency` slots, waiting at most `first_token`."""
        try:
            async with asyncio.timeout(self._config.timeouts.first_token):
                await endpoint.slots.acquire()
        except TimeoutError as exc:
            raise UpstreamUnavailable(
                f"The upstream server has {self._config.max_concurrency} requests in flight "
                "(this model's concurrency cap).",
                status=503,
                upstream=endpoint.url,
            ) from exc

    def _delta(
        self, call: StreamCall, text: str, logprobs: tuple[TextLogprob, ...], last: bool = False
    ) -> TokenDelta:
        reader = call.reader
        return TokenDelta(
            text,
            reader.completion_tokens,
            reader.prompt_tokens,
            (reader.finish_reason or "stop") if last else None,
            logprobs,
            reader.cached_prompt_tokens,
            # On every delta: a stream its client leaves never reaches the last one, and
            # its audit record must still name the server that was answering.
            served_by=call.base_url,
        )

    async def _loop_state(self) -> LoopResources:
        """The client and health task of the running loop, made on first use (the gateway
        runs one loop; a test may run several, each gets its own)."""
        if self._closed:
            raise UpstreamUnavailable(
                f"The engine of {self.model_id} is closed (the models file was reloaded).",
                status=503,
                upstream=self._pool.endpoints[0].url,
            )
        loop = asyncio.get_running_loop()
        if self._state is not None and self._state.loop is loop:
            return self._state
        if self._state is not None:
            self._state.shut_soon()
            self._pool.rebind_slots(self._config.max_concurrency)
        timeouts = self._config.timeouts
        client = HTTPClient(connect_timeout=timeouts.connect, timeout=timeouts.total)
        state = LoopResources(loop, client)
        self._state = state
        state.health = loop.create_task(
            watch_health(self._check, self._pool.endpoints, self._config.health_interval_s),
            name=f"upstream-health-{self.model_id}",
        )
        return state

    async def _check(self, endpoint: Endpoint) -> bool:
        """One health check; a healthy server's facts are read when unknown, a failing
        one's are forgotten (reread once it answers again)."""
        state = self._state
        if state is None:
            return False
        healthy = await check_health(
            state.client, endpoint, self._headers, self._config.timeouts.connect
        )
        if not healthy:
            endpoint.info = None
        elif endpoint.info is None:
            try:
                endpoint.info = await read_server_info(
                    state.client, endpoint.url, self._config.upstream_model, self._headers
                )
            except (HTTPError, ValueError) as exc:
                log.warning("upstream_info_unread", upstream=endpoint.url, reason=describe(exc))
            else:
                self._last_window = endpoint.info.context_window or self._last_window
        return healthy

    async def _ask_upstream(
        self, fallback: int, *, messages: Sequence[ChatMessage] | None = None, text: str = ""
    ) -> int:
        """The count of the first server that gives one (the next is asked when one cannot
        be reached), or `fallback`; a server without `/tokenize` (a 404) is not asked again."""
        if self._tokenize_missing:
            return fallback
        state = await self._loop_state()
        tried: set[str] = set()
        while not self._tokenize_missing:
            endpoint = self._pool.next_endpoint(tried)
            if endpoint is None or endpoint.url in tried:
                break
            tried.add(endpoint.url)
            if endpoint.info is None:
                await self._check(endpoint)  # the body's shape depends on the server's kind
            if endpoint.info is None:
                continue
            try:
                return await self._count_on(state, endpoint, endpoint.info, messages, text)
            except (TransportError, StatusError) as exc:
                log.warning("upstream_tokenize_failed", upstream=endpoint.url, reason=describe(exc))
                if isinstance(exc, TransportError):
                    endpoint.info = None  # gone: reread when it answers again
                elif exc.status in (404, 405):
                    self._tokenize_missing = True
                elif exc.status < 500:
                    break  # the server refused this text; another would too
            except (HTTPError, ValueError, KeyError, TypeError) as exc:
                log.warning("upstream_tokenize_failed", upstream=endpoint.url, reason=describe(exc))
                break
        return fallback

    async def _count_on(
        self,
        state: LoopResources,
        endpoint: Endpoint,
        info: ServerInfo,
        messages: Sequence[ChatMessage] | None,
        text: str,
    ) -> int:
        """`/tokenize` on one server, in the shape its kind takes."""
        if messages is not None:
            return await upstream_prompt_tokens(
                state.client,
                endpoint.url,
                self._config.upstream_model,
                self._headers,
                messages,
                info.is_llama_cpp,
            )
        return await upstream_text_tokens(
            state.client,
            endpoint.url,
            self._config.upstream_model,
            self._headers,
            text,
            info.is_llama_cpp,
        )


def _auth_headers(api_key_env: str | None) -> dict[str, str]:
    """The bearer header from the named variable (never logged), or none."""
    if api_key_env is None:
        return {}
    # A key mounted from a Secret file often ends with the file's newline.
    key = os.environ.get(api_key_env, "").strip()
    if not key:
        raise ValueError(f"the environment variable {api_key_env} (the upstream's key) is empty")
    return {"Authorization": f"Bearer {key}"}
