"""Failover between two real upstreams of one model: a front Bastion whose models file gives
the model two URLs, llama.cpp's `llama-server` and a second `bastion serve` (its own data
folder and key, its embedded SmolLM2, a policy that passes the front's text through).

Both answer and the front's audit record names which did; the front reads the second
Bastion's context window; a killed llama-server fails over to the second Bastion with no
client error, and its open circuit, or for another model id its failed health check, then
keeps requests off it; a server killed mid-answer ends the stream with an error event and
is not retried; with both down the answer is a 503 with `retry-after`; through all of it
the front stays healthy.

Each server starts once for the module. A test that kills llama-server leaves it down; the
next test that needs it restarts it on the same port (the URL the models file names) and
waits for the front to route to it again. What reached the second Bastion is read from its
own audit log, through its auditor API, by a nonce in each prompt.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk
from sqlalchemy import select

from engine import UpstreamConfig, UpstreamEngine, default_model_source
from gateway.db.models import AuditRecord
from gateway.keys.store import create_key
from gateway.services import Services, load_services, open_database
from gateway.settings import REPO_ROOT, Settings
from tests.integration.test_upstream_models import assert_upstream_unavailable
from tests.support.llama_server import LlamaServer, running_llama_server
from tests.support.local_server import free_port, serve_in_thread, spawn_serve, wait_until_ready

pytestmark = pytest.mark.slow  # three servers, one of them a whole Bastion

MODEL_ID = "smol-pair"
HEALTH_MODEL_ID = "smol-pair-health"
KEY_ENV = "BASTION_TEST_INNER_KEY"
INNER_TENANT = "front"
# The second Bastion judges nothing the front already judged and adds no prompt of its own.
PASSTHROUGH_POLICY = f"""\
name: passthrough
applies_to:
  tenants: [{INNER_TENANT}]
description: The front Bastion's upstream; the front runs the checks and retrieval.
input:
  injection: {{enabled: false}}
  pii: {{enabled: false}}
output:
  pii: {{enabled: false}}
  secrets: {{enabled: false}}
  leaks: {{enabled: false}}
  stream_window_chars: 0
retrieval: {{enabled: false}}
model:
  max_tokens: 1024
  system_prompt: ""
"""
# Two ids for one pair of URLs, each watching one mechanism through the audit's upstream.
# MODEL_ID: one slot per URL (a second request while the first streams goes to the next
# URL), and a circuit that opens at the first failure and skips its URL for 8 s; its health
# checks run once, at start, so that none races a kill. HEALTH_MODEL_ID: no retry and a
# circuit that never opens, so only its health checks (every 0.3 s) keep it off a dead URL.
MODELS_FILE = """\
models:
  - id: {model_id}
    upstream: &pair
      base_urls: ["{llama_url}", "{inner_url}"]
      model: {inner_model}   # the second Bastion's id; llama-server serves one model by any
      api_key_env: {key_env}
      timeouts: {{connect: 2, first_token: 60, idle: 30, total: 120}}
      max_concurrency: 1
      resilience: {{health_interval_s: 3600, circuit_failures: 1, circuit_reset_s: 8}}
  - id: {health_model_id}
    upstream:
      <<: *pair
      max_concurrency: 64
      resilience: {{max_retries: 0, health_interval_s: 0.3, circuit_failures: 1000}}
embedded: false
"""
# The prompts read as plain questions: the front's injection classifier scores them below
# 0.05 whatever the nonce (a "Request <nonce>: count ..." prompt scored up to 0.93).
COUNTING = "List the numbers from 1 to 300 separated by commas, for ticket {nonce}."


@dataclass
class RestartableLlama:
    """llama-server on a fixed port: killed as a crash would, started again on the same URL."""

    port: int
    stack: ExitStack
    server: LlamaServer | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.process.poll() is None

    def start(self) -> None:
        self.server = self.stack.enter_context(running_llama_server(port=self.port))

    def kill(self) -> None:
        assert self.server is not None
        self.server.kill()


@dataclass
class InnerBastion:
    """The second upstream: `bastion serve` as its own process on its own data folder."""

    data_dir: Path
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    user_key: str = ""
    auditor_key: str = ""

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def create_keys(self) -> None:
        """Its user key (the front's `api_key_env`) and an auditor key, in its database."""
        sessions = open_database(Settings(data_dir=self.data_dir))
        self.user_key, _ = create_key(sessions, INNER_TENANT, "user")
        self.auditor_key, _ = create_key(sessions, INNER_TENANT, "auditor")

    def spawn(self) -> None:
        with pytest.MonkeyPatch.context() as patch:  # `spawn_serve` passes its environment on
            for name, value in self.env.items():
                patch.setenv(name, value)
            patch.delenv("BASTION_MODELS_FILE", raising=False)
            self.process = spawn_serve(self.data_dir, self.port, self.log_path.open("ab"))

    def wait_ready(self) -> None:
        wait_until_ready(self.root, 300, self.process)

    def stop(self) -> None:
        """SIGTERM: the server drains and exits, as an operator stops it."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def records(self) -> list[dict[str, Any]]:
        """Every chat record of its audit log, read as its auditors read them."""
        records: list[dict[str, Any]] = []
        cursor = 0
        while True:
            page = httpx.get(
                f"{self.root}/audit/records",
                params={"event": "chat.completion", "cursor": cursor, "limit": 500},
                headers={"authorization": f"Bearer {self.auditor_key}"},
                timeout=10,
            ).json()
            records += page["data"]
            if page["next_cursor"] is None:
                return records
            cursor = page["next_cursor"]

    def saw(self, nonce: str) -> bool:
        return any(nonce in (record["prompt_text"] or "") for record in self.records())

    def record_of(self, nonce: str) -> dict[str, Any]:
        """The record of the request carrying `nonce`, waiting for it: it is written as the
        answer ends, a moment after the front has passed that end on."""
        deadline = time.monotonic() + 10
        while True:
            found = [r for r in self.records() if nonce in (r["prompt_text"] or "")]
            if found:
                (record,) = found
                return record
            assert time.monotonic() < deadline, f"the second Bastion has no record of {nonce}"
            time.sleep(0.1)


@dataclass
class Answer:
    request_id: str
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Pair:
    """The front Bastion and its two upstreams."""

    llama: RestartableLlama
    inner: InnerBastion
    front_url: str
    services: Services
    client: OpenAI

    def ask(self, nonce: str, *, stream: bool = False, model: str = MODEL_ID) -> Answer:
        """A chat request to the front whose prompt carries `nonce`; raises on any error."""
        request: dict[str, Any] = {
            "model": model,
            "messages": [
                {
                    "role": "user",
                    "content": f"Which three colours are in a rainbow? (ticket {nonce})",
                }
            ],
            "max_tokens": 8,
            "temperature": 0,
        }
        if not stream:
            raw = self.client.chat.completions.with_raw_response.create(**request)
            completion = raw.parse()
            assert completion.usage is not None
            usage = completion.usage
            text = completion.choices[0].message.content or ""
            return Answer(
                raw.headers["x-request-id"], text, usage.prompt_tokens, usage.completion_tokens
            )
        raw_stream = self.client.chat.completions.with_raw_response.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(raw_stream.parse())
        last_usage = chunks[-1].usage
        assert last_usage is not None
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return Answer(
            raw_stream.headers["x-request-id"],
            text,
            last_usage.prompt_tokens,
            last_usage.completion_tokens,
        )

    def count_aloud(self, nonce: str, max_tokens: int) -> tuple[str, Iterator[ChatCompletionChunk]]:
        """A streamed request for a long answer (counting): its request id and its chunks."""
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": COUNTING.format(nonce=nonce)}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
        assert raw.http_response.status_code == 200
        return raw.headers["x-request-id"], iter(raw.parse())

    def audit_row(self, request_id: str) -> AuditRecord:
        with self.services.sessions() as session:
            query = select(AuditRecord).where(AuditRecord.request_id == request_id)
            return session.scalars(query).one()

    def upstream_of(self, request_id: str) -> str:
        return str(self.audit_row(request_id).details["upstream"])

    def ensure_inner_running(self) -> None:
        if not self.inner.running:
            self.inner.spawn()
            self.inner.wait_ready()

    def ensure_llama_serving(self) -> None:
        """llama-server up, and the front sending to it again (its circuit closed)."""
        self.ensure_inner_running()
        if not self.llama.running:
            self.llama.start()
        deadline = time.monotonic() + 60
        while self.upstream_of(self.ask(nonce()).request_id) != self.llama.base_url:
            assert time.monotonic() < deadline, "the front never went back to llama-server"
            time.sleep(1)

    def assert_front_healthy(self) -> None:
        for probe in ("/healthz", "/readyz"):
            assert httpx.get(f"{self.front_url}{probe}", timeout=10).status_code == 200


def nonce() -> str:
    return f"n{uuid.uuid4().hex[:10]}"


def first_text(stream: Iterator[ChatCompletionChunk]) -> str:
    """Reads `stream` up to its first chunk with text, and returns that text."""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            return chunk.choices[0].delta.content
    raise AssertionError("the stream ended without text")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    inner_dir = tmp_path_factory.mktemp("inner-bastion")
    inner_policies = inner_dir / "policies"
    inner_policies.mkdir()
    (inner_policies / "passthrough.yaml").write_text(PASSTHROUGH_POLICY)
    inner = InnerBastion(
        inner_dir / "data",
        {
            "BASTION_POLICY_DIR": str(inner_policies),
            "BASTION_POLICY_RELOAD_SECONDS": "0",
            "BASTION_SAMPLE_CORPUS": str(inner_dir / "no-corpus"),
            "BASTION_ENGINE_THREADS": "1",
        },
        inner_dir / "serve.log",
    )
    with ExitStack() as stack, pytest.MonkeyPatch.context() as patch:
        stack.callback(inner.kill)
        inner.create_keys()
        inner.spawn()  # it loads its engine while the front loads its checks
        llama = RestartableLlama(free_port(), stack)
        llama.start()

        front_dir = tmp_path_factory.mktemp("front-bastion")
        policy_dir = front_dir / "policies"
        policy_dir.mkdir()
        shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
        models_file = front_dir / "models.yaml"
        models_file.write_text(
            MODELS_FILE.format(
                model_id=MODEL_ID,
                health_model_id=HEALTH_MODEL_ID,
                llama_url=llama.base_url,
                inner_url=inner.base_url,
                inner_model=default_model_source().model_id,
                key_env=KEY_ENV,
            )
        )
        patch.setenv(KEY_ENV, inner.user_key)
        settings = Settings(
            data_dir=front_dir / "data",
            port=free_port(),
            policy_dir=policy_dir,
            policy_reload_seconds=0.2,
            models_file=models_file,
            sample_corpus=None,
        )
        services = load_services(settings)
        secret, _ = create_key(services.sessions, settings.default_tenant, "user")
        inner.wait_ready()
        with serve_in_thread(settings, services) as front_url:
            client = OpenAI(base_url=f"{front_url}/v1", api_key=secret, max_retries=0, timeout=120)
            yield Pair(llama, inner, front_url, services, client)


def test_both_upstreams_answer_and_the_audit_names_which_did(pair: Pair) -> None:
    pair.ensure_llama_serving()
    long_nonce, short_nonce = nonce(), nonce()
    long_id, stream = pair.count_aloud(long_nonce, max_tokens=512)
    first = first_text(stream)
    # llama-server's one slot is taken by the stream (512 tokens: still going on a busy
    # machine when the output checks release its first text): the next request goes to the
    # next URL.
    short = pair.ask(short_nonce)
    # On a busy machine the output checks may release the rest of the answer with its
    # first piece: what counts is that the whole answer came.
    answer = first + "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert answer.strip() and pair.audit_row(long_id).outcome == "ok"

    assert pair.upstream_of(long_id) == pair.llama.base_url
    assert pair.upstream_of(short.request_id) == pair.inner.base_url
    assert short.text.strip()
    # The second Bastion saw only the request it answered, and its usage is what the
    # front's client got.
    record = pair.inner.record_of(short_nonce)
    assert not pair.inner.saw(long_nonce)
    assert record["tenant"] == INNER_TENANT and record["status_code"] == 200
    assert (short.prompt_tokens, short.completion_tokens) == (
        record["prompt_tokens"],
        record["completion_tokens"],
    )


def test_the_front_reads_the_second_bastions_context_window(pair: Pair) -> None:
    """Bastion lists `max_model_len` on `/v1/models`, where an upstream engine looks."""
    pair.ensure_inner_running()
    config = UpstreamConfig(
        "inner-only", (pair.inner.base_url,), default_model_source().model_id, api_key_env=KEY_ENV
    )

    async def window() -> int:
        engine = UpstreamEngine(config)
        try:
            await engine.start()
            return engine.context_window
        finally:
            await engine.aclose()

    assert asyncio.run(window()) == 8192  # SmolLM2's, not the engine's 4096 fallback


@pytest.mark.parametrize("stream", [False, True])
def test_a_killed_llama_server_fails_over_and_its_open_circuit_skips_it(
    pair: Pair, stream: bool
) -> None:
    pair.ensure_llama_serving()
    pair.llama.kill()
    failed_over = pair.ask(nonce(), stream=stream)  # no error reaches the client
    assert pair.upstream_of(failed_over.request_id) == pair.inner.base_url
    assert failed_over.text.strip() and failed_over.completion_tokens > 0

    # Back on the same URL, llama-server answers health checks again, but its circuit,
    # opened by the refused attempt, keeps the front off it until the reset.
    pair.llama.start()
    skipped = pair.ask(nonce(), stream=stream)
    assert pair.upstream_of(skipped.request_id) == pair.inner.base_url
    pair.ensure_llama_serving()  # the trial after the reset closes the circuit
    pair.assert_front_healthy()


def test_a_dead_url_is_skipped_once_its_health_check_fails(pair: Pair) -> None:
    pair.ensure_llama_serving()
    assert pair.upstream_of(pair.ask(nonce(), model=HEALTH_MODEL_ID).request_id) == (
        pair.llama.base_url
    )
    pair.llama.kill()
    deadline = time.monotonic() + 30
    while True:  # refused (503, no retry) until a health check has seen the URL down
        try:
            answers = [pair.ask(nonce(), model=HEALTH_MODEL_ID)]
            break
        except openai.InternalServerError:
            assert time.monotonic() < deadline, "the health check never saw llama-server down"
            time.sleep(0.2)
    answers += [pair.ask(nonce(), model=HEALTH_MODEL_ID, stream=s) for s in (False, True, False)]
    assert {pair.upstream_of(a.request_id) for a in answers} == {pair.inner.base_url}

    pair.llama.start()  # a health check sees it up again: it is first again
    deadline = time.monotonic() + 30
    while pair.upstream_of(pair.ask(nonce(), model=HEALTH_MODEL_ID).request_id) != (
        pair.llama.base_url
    ):
        assert time.monotonic() < deadline, "the health check never saw llama-server back"
        time.sleep(0.2)


def test_an_upstream_killed_mid_stream_is_an_error_event_and_not_retried(pair: Pair) -> None:
    pair.ensure_llama_serving()
    dying = nonce()
    request_id, stream = pair.count_aloud(dying, max_tokens=400)
    texts = [first_text(stream)]
    pair.llama.kill()
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            texts += [chunk.choices[0].delta.content or ""] if chunk.choices else []
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "upstream_unavailable"
    assert "".join(texts).strip()

    row = pair.audit_row(request_id)
    assert (row.outcome, row.status_code, row.error_code) == ("error", 502, "upstream_unavailable")
    assert row.details["upstream"] == pair.llama.base_url
    assert not pair.inner.saw(dying)  # text had been sent: no retry on the other URL

    pair.assert_front_healthy()
    after = pair.ask(nonce())
    assert pair.upstream_of(after.request_id) == pair.inner.base_url


def test_with_both_upstreams_down_the_answer_is_a_503_with_retry_after(pair: Pair) -> None:
    pair.ensure_inner_running()
    if pair.llama.running:
        pair.llama.kill()
    pair.inner.stop()
    for stream in (False, True, False):
        with pytest.raises(openai.InternalServerError) as caught:
            pair.client.chat.completions.create(
                model=MODEL_ID,
                messages=[{"role": "user", "content": "Name three colours."}],
                max_tokens=8,
                stream=stream,
            )
        response = caught.value.response
        assert_upstream_unavailable(response)
        error = response.json()["error"]
        row = pair.audit_row(response.headers["x-request-id"])
        assert (row.status_code, row.error_code) == (503, "upstream_unavailable")
    # Both circuits opened on the refusals: the last request was not sent anywhere.
    assert "circuit open" in error["message"]
    pair.assert_front_healthy()
