"""Bastion in front of a real llama-server: `/v1/models`, streamed chat with usage, input
PII redacted before it leaves, the upstream named in the audit record, models a policy
does not allow, an upstream that refuses connections, and an unknown model.

The models file points at a recording proxy that forwards to llama-server, so the tests
see exactly what left Bastion.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionFunctionToolParam
from sqlalchemy import select

from engine import PagedEngine
from gateway.db.models import AuditRecord
from gateway.keys.store import create_key
from gateway.services import Services, load_services
from gateway.settings import REPO_ROOT, Settings
from tests.integration.conftest import RecordingEngine
from tests.support.llama_server import MODEL_ALIAS, LlamaServer, running_llama_server
from tests.support.local_server import free_port, serve_in_thread

UPSTREAM_ID = "smol-upstream"
REFUSING_ID = "refusing-upstream"
DYING_ID = "dying-upstream"
LEAKY_ID = "leaky-upstream"
TOOL_ID = "tool-upstream"
WEATHER_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
REFUSED_URL = "http://127.0.0.1:9/v1"  # nothing listens there: connecting is refused at once
EMAIL = "jane.roe@example.com"


@dataclass
class RecordingProxy:
    """Forwards every request to llama-server and keeps the JSON bodies it was sent."""

    target: str
    server: ThreadingHTTPServer | None = None
    bodies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [body for body in self.bodies if "messages" in body]


def _handler(proxy: RecordingProxy) -> type[BaseHTTPRequestHandler]:
    class Forward(BaseHTTPRequestHandler):
        # HTTP/1.0: the answer ends when the connection closes, so SSE streams through.
        def do_GET(self) -> None:
            self._forward(None)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            if raw:
                proxy.bodies.append(json.loads(raw))
            self._forward(raw)

        def _forward(self, raw: bytes | None) -> None:
            headers = {"content-type": "application/json"}
            with httpx.stream(
                self.command, proxy.target + self.path, content=raw, headers=headers, timeout=120
            ) as answer:
                self.send_response(answer.status_code)
                self.send_header("content-type", answer.headers.get("content-type", ""))
                self.end_headers()
                for chunk in answer.iter_raw():
                    self.wfile.write(chunk)
                    self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the tests read the recorded bodies instead."""

    return Forward


class ScriptedUpstream:
    """An OpenAI-compatible server that streams `texts` as an answer, then ends it (finish
    reason, usage, `[DONE]`), or with `dies` drops the connection mid-body (the chunked
    encoding left unterminated), as a crashed server does."""

    def __init__(self, texts: list[str], dies: bool) -> None:
        self._texts = texts
        self._dies = dies
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            request = read_request(connection)
            if not request.startswith(b"POST"):
                body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
                head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
                connection.sendall(head.encode() + b"content-type: application/json\r\n\r\n" + body)
                return
            connection.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            # A text completion's chunks carry `text`, a chat's `delta.content`.
            completions = request.split(b"\r\n", 1)[0].startswith(b"POST /v1/completions ")
            events = [
                {
                    "choices": [
                        {"index": 0, "text": t}
                        if completions
                        else {"index": 0, "delta": {"content": t}}
                    ]
                }
                for t in self._texts
            ]
            if not self._dies:
                events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                usage = {"prompt_tokens": 9, "completion_tokens": len(self._texts)}
                events.append({"choices": [], "usage": usage | {"total_tokens": 9}})
            lines = [f"data: {json.dumps(event)}\n\n" for event in events]
            lines += [] if self._dies else ["data: [DONE]\n\n"]
            for line in lines:
                data = line.encode()
                connection.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            if not self._dies:
                connection.sendall(b"0\r\n\r\n")

    def close(self) -> None:
        self._listener.close()


def read_request(connection: socket.socket) -> bytes:
    """A whole request read from `connection`: its head (returned), then `content-length`
    bytes of body. A server that closes its socket with bytes of a request unread sends a
    reset, and the client's kernel then drops what of the answer it has not read yet."""
    head, length = b"", 0
    with connection.makefile("rb") as reader:
        while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
            head += line
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        reader.read(length)
    return head


def test_the_scripted_upstream_answers_once_the_whole_request_has_come() -> None:
    """Not before the body (a client sends it after the head): with the body unread, its
    close would reset the connection under an answer still on its way."""
    server = ScriptedUpstream(["Hi"], dies=False)
    body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n"
    try:
        port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(head.encode())
            client.settimeout(0.2)
            with pytest.raises(TimeoutError):
                client.recv(1)
            client.settimeout(5)
            client.sendall(body)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
    finally:
        server.close()
    assert b"data: [DONE]" in answer and answer.endswith(b"0\r\n\r\n")


@pytest.fixture(scope="module")
def dying_upstream() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream(["Hello there, "] * 12, dies=True)
    yield server
    server.close()


@pytest.fixture(scope="module")
def leaky_upstream() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream(
        ["Write to ", "me at jane.", "roe@exam", "ple.com any", " time."], dies=False
    )
    yield server
    server.close()


@pytest.fixture(scope="module")
def tool_upstream() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream([WEATHER_CALL[:20], WEATHER_CALL[20:]], dies=False)
    yield server
    server.close()


@pytest.fixture(scope="module")
def llama_server() -> Iterator[LlamaServer]:
    with running_llama_server() as server:
        yield server


@pytest.fixture(scope="module")
def proxy(llama_server: LlamaServer) -> Iterator[RecordingProxy]:
    recording = RecordingProxy(llama_server.root)
    recording.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recording))
    thread = threading.Thread(target=recording.server.serve_forever, daemon=True)
    thread.start()
    yield recording
    recording.server.shutdown()


def models_file(path: Path, proxy_url: str, dying_url: str, leaky_url: str, tool_url: str) -> Path:
    path.write_text(
        f"""\
models:
  - id: {UPSTREAM_ID}
    upstream:
      base_urls: ["{proxy_url}"]
      model: {MODEL_ALIAS}
      timeouts: {{connect: 2, first_token: 60, idle: 30, total: 120}}
      tokenizer: estimate
  - id: {REFUSING_ID}
    upstream:
      base_urls: ["{REFUSED_URL}"]
      model: {MODEL_ALIAS}
      timeouts: {{connect: 1, first_token: 5, idle: 5, total: 10}}
      context_window: 2048
      tokenizer: estimate
  - id: {DYING_ID}
    upstream:
      base_urls: ["{dying_url}"]
      model: m
      timeouts: {{connect: 1, first_token: 5, idle: 5, total: 10}}
      context_window: 2048
      tokenizer: estimate
  - id: {LEAKY_ID}
    upstream:
      base_urls: ["{leaky_url}"]
      model: m
      context_window: 2048
      tokenizer: estimate
  - id: {TOOL_ID}
    upstream:
      base_urls: ["{tool_url}"]
      model: m
      context_window: 2048
      tokenizer: estimate
"""
    )
    return path


@dataclass
class UpstreamBastion:
    base_url: str
    services: Services
    settings: Settings
    client: OpenAI

    def tenant_client(self, tenant: str) -> OpenAI:
        secret, _ = create_key(self.services.sessions, tenant, "user")
        return OpenAI(base_url=f"{self.base_url}/v1", api_key=secret, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def bastion(
    tmp_path_factory: pytest.TempPathFactory,
    chat_engine: PagedEngine,
    proxy: RecordingProxy,
    dying_upstream: ScriptedUpstream,
    leaky_upstream: ScriptedUpstream,
    tool_upstream: ScriptedUpstream,
) -> Iterator[UpstreamBastion]:
    data_dir = tmp_path_factory.mktemp("bastion-upstream")
    policy_dir = tmp_path_factory.mktemp("policies-upstream")
    shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
    (policy_dir / "embedded-only.yaml").write_text(
        f"name: embedded-only\napplies_to:\n  tenants: [embedded-only]\n"
        f"model:\n  allowed_models: [{chat_engine.model_id}]\n"
    )
    (policy_dir / "unchecked.yaml").write_text(
        "name: unchecked\napplies_to:\n  tenants: [unchecked]\noutput:\n"
        "  pii: {enabled: false}\n  secrets: {enabled: false}\n  leaks: {enabled: false}\n"
    )
    settings = Settings(
        data_dir=data_dir,
        port=free_port(),
        policy_dir=policy_dir,
        policy_reload_seconds=0.2,
        models_file=models_file(
            data_dir / "models.yaml",
            proxy.base_url,
            dying_upstream.base_url,
            leaky_upstream.base_url,
            tool_upstream.base_url,
        ),
    )
    services = load_services(settings, engine=RecordingEngine(chat_engine))
    secret, _ = create_key(services.sessions, settings.default_tenant, "user")
    with serve_in_thread(settings, services) as base_url:
        client = OpenAI(base_url=f"{base_url}/v1", api_key=secret, max_retries=0, timeout=120)
        yield UpstreamBastion(base_url, services, settings, client)


def audit_row(bastion: UpstreamBastion, request_id: str) -> AuditRecord:
    with bastion.services.sessions() as session:
        query = select(AuditRecord).where(AuditRecord.request_id == request_id)
        return session.scalars(query).one()


def test_models_lists_the_embedded_and_every_upstream_model(
    bastion: UpstreamBastion, chat_engine: PagedEngine
) -> None:
    ids = [model.id for model in bastion.client.models.list()]
    assert ids == [chat_engine.model_id, UPSTREAM_ID, REFUSING_ID, DYING_ID, LEAKY_ID, TOOL_ID]


def test_a_streamed_chat_to_the_upstream_returns_text_and_usage(
    bastion: UpstreamBastion, proxy: RecordingProxy
) -> None:
    stream = bastion.client.chat.completions.create(
        model=UPSTREAM_ID,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text.strip()
    assert chunks[0].model == UPSTREAM_ID
    assert usage is not None and usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 16
    sent = proxy.chat_bodies()[-1]
    assert sent["model"] == MODEL_ALIAS and sent["stream"] is True


def test_input_pii_is_redacted_before_it_leaves_and_the_audit_names_the_upstream(
    bastion: UpstreamBastion, proxy: RecordingProxy
) -> None:
    before = len(proxy.chat_bodies())
    response = bastion.client.chat.completions.with_raw_response.create(
        model=UPSTREAM_ID,
        messages=[{"role": "user", "content": f"Repeat my address: {EMAIL}"}],
        max_tokens=12,
        temperature=0,
    )
    completion = response.parse()
    assert completion.model == UPSTREAM_ID
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    sent = proxy.chat_bodies()[before:]
    assert len(sent) == 1
    sent_text = json.dumps(sent[0]["messages"])
    assert "Repeat my address" in sent_text
    assert EMAIL not in sent_text
    request_id = response.headers["x-request-id"]
    row = audit_row(bastion, request_id)
    assert row.details["upstream"] == proxy.base_url
    assert row.model == UPSTREAM_ID and row.status_code == 200


def test_a_model_the_policy_does_not_allow_is_refused(
    bastion: UpstreamBastion, proxy: RecordingProxy, chat_engine: PagedEngine
) -> None:
    client = bastion.tenant_client("embedded-only")
    before = len(proxy.bodies)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        client.chat.completions.create(
            model=UPSTREAM_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_allowed" and error["param"] == "model"
    assert UPSTREAM_ID in error["message"]
    assert len(proxy.bodies) == before  # nothing left Bastion
    allowed = client.chat.completions.create(
        model=chat_engine.model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert allowed.model == chat_engine.model_id


def assert_upstream_unavailable(response: httpx.Response) -> None:
    """A 503 in OpenAI's error shape that tells the client when to come back."""
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("server_error", "upstream_unavailable")


def test_an_upstream_that_refuses_connections_is_a_503_with_retry_after(
    bastion: UpstreamBastion,
) -> None:
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as caught:
            bastion.client.chat.completions.create(
                model=REFUSING_ID,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                stream=stream,
            )
        response = caught.value.response
        assert_upstream_unavailable(response)
        error = response.json()["error"]
        assert "refused" in error["message"] or "circuit open" in error["message"]
        row = audit_row(bastion, response.headers["x-request-id"])
        assert (row.status_code, row.error_code) == (503, "upstream_unavailable")
        assert row.details["upstream"] == REFUSED_URL
    # Bastion itself stays healthy: its probes do not follow an upstream that is down.
    assert bastion.client.models.list()
    for probe in ("/healthz", "/readyz"):
        assert httpx.get(f"{bastion.base_url}{probe}", timeout=10).status_code == 200


def test_an_unknown_model_is_a_404_in_openais_shape(bastion: UpstreamBastion) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        bastion.client.chat.completions.create(
            model="gpt-4", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found"
    assert UPSTREAM_ID in error["message"]
    with pytest.raises(openai.NotFoundError):
        bastion.client.completions.create(model="gpt-4", prompt="Hi", max_tokens=4)


def test_an_upstream_dying_mid_stream_ends_the_stream_with_an_error_event(
    bastion: UpstreamBastion, dying_upstream: ScriptedUpstream
) -> None:
    response = bastion.client.chat.completions.with_raw_response.create(
        model=DYING_ID,
        messages=[{"role": "user", "content": "Greet me."}],
        max_tokens=64,
        stream=True,
    )
    assert response.http_response.status_code == 200  # the answer had begun
    texts: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in response.parse():
            if chunk.choices:
                texts.append(chunk.choices[0].delta.content or "")
    assert "Hello there" in "".join(texts)
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "upstream_unavailable"
    row = audit_row(bastion, response.headers["x-request-id"])
    assert (row.outcome, row.status_code, row.error_code) == ("error", 502, "upstream_unavailable")
    assert row.details["upstream"] == dying_upstream.base_url


def test_completions_reach_the_upstream_and_logit_bias_is_refused_for_it(
    bastion: UpstreamBastion, proxy: RecordingProxy
) -> None:
    before = len(proxy.bodies)
    completion = bastion.client.completions.create(
        model=UPSTREAM_ID, prompt=f"Mail {EMAIL} says", max_tokens=8, temperature=0
    )
    assert completion.model == UPSTREAM_ID and completion.choices[0].text
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    sent = proxy.bodies[before:]
    assert len(sent) == 1 and "Mail" in sent[0]["prompt"] and EMAIL not in sent[0]["prompt"]
    with pytest.raises(openai.BadRequestError) as caught:
        bastion.client.chat.completions.create(
            model=UPSTREAM_ID,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            logit_bias={"42": 5},
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("unsupported_parameter", "logit_bias")
    assert len(proxy.bodies) == before + 1  # the refused one never left


def test_a_models_file_edit_is_picked_up_and_a_bad_one_keeps_the_last_good(
    bastion: UpstreamBastion, proxy: RecordingProxy
) -> None:
    path = bastion.settings.models_file
    assert path is not None
    original = path.read_text()
    registry = bastion.services.models
    failures = registry.reload_failures
    try:
        added = original + (
            f'  - id: second-name\n    upstream:\n      base_urls: ["{proxy.base_url}"]\n'
            f"      model: {MODEL_ALIAS}\n      tokenizer: estimate\n"
        )
        path.write_text(added)
        wait_for(lambda: "second-name" in registry.model_ids())
        answer = bastion.client.chat.completions.create(
            model="second-name", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert answer.model == "second-name"
        path.write_text(added.replace("tokenizer: estimate\n", "tokenizr: estimate\n", 1))
        wait_for(lambda: registry.reload_failures > failures)
        assert registry.error is not None and "did you mean 'tokenizer'" in registry.error
        ids = [model.id for model in bastion.client.models.list()]
        assert "second-name" in ids and UPSTREAM_ID in ids
        metrics = httpx.get(f"{bastion.base_url}/metrics", timeout=10).text
        assert f"bastion_models_reload_failures {float(registry.reload_failures)}" in metrics
    finally:
        path.write_text(original)
        wait_for(lambda: "second-name" not in registry.model_ids())


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the models file was not reloaded"
        time.sleep(0.05)


def test_the_context_window_is_the_upstreams_and_a_long_prompt_never_leaves(
    bastion: UpstreamBastion, proxy: RecordingProxy
) -> None:
    engine = bastion.services.models.engine_for(UPSTREAM_ID)
    wait_for(lambda: engine.context_window == 1024)  # llama-server's 2048 over two slots
    before = len(proxy.bodies)
    with pytest.raises(openai.BadRequestError) as caught:
        bastion.client.chat.completions.create(
            model=UPSTREAM_ID,
            messages=[{"role": "user", "content": "colour " * 600}],
            max_tokens=400,
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded"
    assert "1024" in error["message"]
    assert len(proxy.bodies) == before


def test_a_corpus_question_to_the_upstream_gets_its_sources_and_citations(
    bastion: UpstreamBastion, proxy: RecordingProxy
) -> None:
    before = len(proxy.chat_bodies())
    completion = bastion.client.chat.completions.create(
        model=UPSTREAM_ID,
        messages=[{"role": "user", "content": "How many days of paid vacation do employees get?"}],
        max_tokens=16,
        temperature=0,
    )
    citations = (completion.model_extra or {})["citations"]
    assert any(c["source"].endswith("vacation-policy.md") for c in citations)
    (sent,) = proxy.chat_bodies()[before:]
    system = sent["messages"][0]
    assert system["role"] == "system" and "[1]" in system["content"]
    assert "27 days" in system["content"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_output_checks_read_the_upstreams_answer(
    bastion: UpstreamBastion, stream: bool
) -> None:
    request = {
        "model": LEAKY_ID,
        "messages": [{"role": "user", "content": "How do I reach you?"}],
        "max_tokens": 32,
    }
    if stream:
        chunks = list(bastion.client.chat.completions.create(**request, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = bastion.client.chat.completions.create(**request).choices[0].message.content or ""
    assert text.startswith("Write to me at ") and text.endswith(" any time.")
    assert EMAIL not in text and "roe@" not in text


def test_with_no_output_check_the_stream_passes_each_piece_on_as_it_came(
    bastion: UpstreamBastion,
) -> None:
    """Nothing to check: no piece waits for a word's end or for the next piece, as the
    held-back window makes them when a check is on."""
    chunks = bastion.tenant_client("unchecked").chat.completions.create(
        model=LEAKY_ID,
        messages=[{"role": "user", "content": "How do I reach you?"}],
        max_tokens=32,
        stream=True,
    )
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert pieces == ["Write to ", "me at jane.", "roe@exam", "ple.com any", " time."]


def test_with_no_output_check_a_completions_stream_passes_each_piece_on_as_it_came(
    bastion: UpstreamBastion,
) -> None:
    """The same for text completions, whose stream held pieces back as chat's did."""
    chunks = bastion.tenant_client("unchecked").completions.create(
        model=LEAKY_ID, prompt="How do I reach you?", max_tokens=32, stream=True
    )
    pieces = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert pieces == ["Write to ", "me at jane.", "roe@exam", "ple.com any", " time."]


WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_an_upstreams_tool_call_is_validated_and_returned(bastion: UpstreamBastion) -> None:
    completion = bastion.client.chat.completions.create(
        model=TOOL_ID,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=64,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]


def test_a_json_schema_answer_from_the_upstream_is_forwarded_and_validated(
    bastion: UpstreamBastion, proxy: RecordingProxy
) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    answer = bastion.client.chat.completions.create(
        model=UPSTREAM_ID,
        messages=[{"role": "user", "content": "Pick a colour of the sky."}],
        max_tokens=24,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "colour", "schema": schema, "strict": True},
        },
    )
    assert answer.choices[0].finish_reason == "stop"
    assert json.loads(answer.choices[0].message.content or "")["colour"] in {"red", "green", "blue"}
    sent = proxy.chat_bodies()[-1]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["schema"] == schema
