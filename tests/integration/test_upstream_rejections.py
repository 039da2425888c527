"""What Bastion does when an upstream's answer breaks the client's contract: a tool call
whose arguments miss the tool's schema or are not JSON, and a `response_format` answer that
is not the JSON the schema asks for. As with the embedded engine, such an answer is never
passed on, and the audit record names the check that stopped it.

Each upstream is a scripted OpenAI-compatible server; the JSON one sits behind a recording
proxy, so the test also sees the `response_format` that left Bastion.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types.shared_params import ResponseFormatJSONSchema
from sqlalchemy import select

from gateway.db.models import AuditRecord
from gateway.services import Services
from tests.integration.test_upstream_models import (
    WEATHER_CALL,
    WEATHER_TOOL,
    RecordingProxy,
    ScriptedUpstream,
    _handler,
)
from tests.support.upstream_front import models_yaml, upstream_front

BAD_ARGS_ID = "bad-arguments-upstream"
NOT_JSON_ID = "not-json-arguments-upstream"
JSON_ID = "json-upstream"
PROSE_ID = "prose-upstream"
VALID_ID = "valid-call-upstream"
VALID_JSON_ID = "valid-json-upstream"
# `city` must be a string; the second call's arguments object never closes.
BAD_ARGS_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": 42}}</tool_call>'
NOT_JSON_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>'
OFF_SCHEMA_JSON = '{"colour": "purple"}'
VALID_JSON = '{"colour": "blue"}'
COLOUR_SCHEMA = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}
COLOUR_FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {"name": "colour", "schema": COLOUR_SCHEMA, "strict": True},
}


@dataclass
class Fronted:
    base_url: str
    services: Services
    client: OpenAI
    proxy: RecordingProxy

    def audit_row(self, request_id: str) -> AuditRecord:
        with self.services.sessions() as session:
            query = select(AuditRecord).where(AuditRecord.request_id == request_id)
            return session.scalars(query).one()


def _split(text: str) -> list[str]:
    """`text` in three pieces, as an upstream streams an answer a few tokens at a time."""
    third = len(text) // 3
    return [text[:third], text[third : 2 * third], text[2 * third :]]


@pytest.fixture(scope="module")
def fronted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronted]:
    upstreams = {
        BAD_ARGS_ID: ScriptedUpstream(_split(BAD_ARGS_CALL), dies=False),
        NOT_JSON_ID: ScriptedUpstream(_split(NOT_JSON_CALL), dies=False),
        VALID_ID: ScriptedUpstream(_split(WEATHER_CALL), dies=False),
        PROSE_ID: ScriptedUpstream(["Sure! The sky ", "is blue."], dies=False),
        VALID_JSON_ID: ScriptedUpstream(_split(VALID_JSON), dies=False),
    }
    json_upstream = ScriptedUpstream(_split(OFF_SCHEMA_JSON), dies=False)
    proxy = RecordingProxy(json_upstream.base_url.removesuffix("/v1"))
    proxy.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    threading.Thread(target=proxy.server.serve_forever, daemon=True).start()
    urls = {**{key: u.base_url for key, u in upstreams.items()}, JSON_ID: proxy.base_url}

    folder = tmp_path_factory.mktemp("bastion-rejections")
    try:
        with upstream_front(folder, models_yaml(urls)) as front:
            client = OpenAI(
                base_url=f"{front.base_url}/v1", api_key=front.secret, max_retries=0, timeout=60
            )
            yield Fronted(front.base_url, front.services, client, proxy)
    finally:
        proxy.server.shutdown()
        for upstream in (*upstreams.values(), json_upstream):
            upstream.close()


def _verdicts(row: AuditRecord, check: str) -> list[str]:
    return [v["action"] for v in row.verdicts if v["check"] == check]


@pytest.mark.parametrize("model", [BAD_ARGS_ID, NOT_JSON_ID])
def test_an_upstreams_invalid_tool_call_is_withheld_and_audited(
    fronted: Fronted, model: str
) -> None:
    response = fronted.client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=64,
    )
    choice = response.parse().choices[0]
    assert choice.finish_reason == "content_filter"
    assert not choice.message.tool_calls and choice.message.content is None
    row = fronted.audit_row(response.headers["x-request-id"])
    assert (row.outcome, row.status_code) == ("content_filter", 200)
    assert _verdicts(row, "tool_call_schema") == ["block"]
    assert row.details["upstream"].startswith("http://127.0.0.1:")


def test_an_upstreams_streamed_call_that_fails_its_schema_ends_with_an_error_event(
    fronted: Fronted,
) -> None:
    """The call's name and arguments went out as they came; only the whole answer shows
    they miss the schema, so the stream ends with an error event, not `[DONE]`."""
    request = {
        "model": BAD_ARGS_ID,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "max_tokens": 64,
        "stream": True,
    }
    events, request_id, done = _streamed(fronted, request)
    assert not done
    error = events[-1]["error"]
    assert error["code"] == "invalid_tool_call" and error["type"] == "server_error"
    assert "$.city" in error["message"]
    row = fronted.audit_row(request_id)
    assert _verdicts(row, "tool_call_schema") == ["block"]
    assert (row.outcome, row.status_code, row.error_code) == ("error", 500, "invalid_tool_call")


def test_an_upstreams_valid_call_streams_in_openais_shape(fronted: Fronted) -> None:
    """The contrast to the test above: the call the client's helpers assemble from the
    deltas (`index`, `id` and name first, then the arguments in fragments)."""
    stream = fronted.client.chat.completions.create(
        model=VALID_ID,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=64,
        stream=True,
    )
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].index == 0 and deltas[0].id and deltas[0].function is not None
    assert deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert json.loads(arguments) == {"city": "Paris"}
    assert all(d.index == 0 for d in deltas) and all(d.id is None for d in deltas[1:])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices and c.choices[0].delta.content for c in chunks)


def test_the_schema_is_forwarded_and_an_off_schema_answer_is_withheld(fronted: Fronted) -> None:
    before = len(fronted.proxy.chat_bodies())
    response = fronted.client.chat.completions.with_raw_response.create(
        model=JSON_ID,
        messages=[{"role": "user", "content": "Pick a colour of the sky."}],
        max_tokens=24,
        response_format=COLOUR_FORMAT,
    )
    (sent,) = fronted.proxy.chat_bodies()[before:]
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"] == COLOUR_SCHEMA
    choice = response.parse().choices[0]
    assert choice.finish_reason == "content_filter" and choice.message.content is None
    refusal = choice.message.refusal or ""
    assert refusal.startswith("The answer was withheld") and "$.colour fails 'enum'" in refusal
    assert "purple" not in refusal  # the answer's text stays out of the message
    row = fronted.audit_row(response.headers["x-request-id"])
    assert (row.outcome, row.status_code) == ("content_filter", 200)
    assert _verdicts(row, "structured_output") == ["block"]


def test_an_upstream_answer_that_is_not_json_is_withheld(fronted: Fronted) -> None:
    response = fronted.client.chat.completions.with_raw_response.create(
        model=PROSE_ID,
        messages=[{"role": "user", "content": "Pick a colour of the sky."}],
        max_tokens=24,
        response_format=COLOUR_FORMAT,
    )
    choice = response.parse().choices[0]
    assert choice.finish_reason == "content_filter" and choice.message.content is None
    assert "not JSON" in (choice.message.refusal or "")
    row = fronted.audit_row(response.headers["x-request-id"])
    assert row.outcome == "content_filter"
    assert _verdicts(row, "structured_output") == ["block"]


def _stream_events(fronted: Fronted, model: str) -> tuple[list[dict[str, Any]], str, bool]:
    """A streamed `response_format` request's events, its request id, and whether `[DONE]`
    came."""
    request = {
        "model": model,
        "messages": [{"role": "user", "content": "Pick a colour of the sky."}],
        "max_tokens": 24,
        "response_format": COLOUR_FORMAT,
        "stream": True,
    }
    return _streamed(fronted, request)


def _streamed(
    fronted: Fronted, request: dict[str, object]
) -> tuple[list[dict[str, Any]], str, bool]:
    """A streamed request's events, its request id, and whether `[DONE]` came."""
    headers = {"authorization": f"Bearer {fronted.client.api_key}"}
    with httpx.stream(
        "POST", f"{fronted.base_url}/v1/chat/completions", json=request, headers=headers
    ) as answer:
        assert answer.status_code == 200
        data = [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]
        request_id = answer.headers["x-request-id"]
    done = "[DONE]" in data
    return [json.loads(d) for d in data if d != "[DONE]"], request_id, done


def _streamed_content(events: list[dict[str, Any]]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for event in events
        for choice in event.get("choices", [])
    )


def test_a_streamed_off_schema_answer_is_never_sent(fronted: Fronted) -> None:
    """An upstream need not honour `response_format`: its JSON is held until the whole
    answer is checked, and an answer that fails the schema ends the stream with an error
    event instead of reaching the client."""
    events, request_id, done = _stream_events(fronted, JSON_ID)
    assert "purple" not in _streamed_content(events) and not done
    error = events[-1]["error"]
    assert error["code"] == "answer_withheld"
    assert "$.colour fails 'enum'" in error["message"]
    row = fronted.audit_row(request_id)
    assert _verdicts(row, "structured_output") == ["block"]
    assert (row.outcome, row.error_code) == ("error", "answer_withheld")


def test_a_streamed_answer_that_meets_the_schema_is_sent_whole(fronted: Fronted) -> None:
    events, request_id, done = _stream_events(fronted, VALID_JSON_ID)
    assert done and json.loads(_streamed_content(events)) == {"colour": "blue"}
    finishes = [
        choice["finish_reason"]
        for event in events
        for choice in event.get("choices", [])
        if choice["finish_reason"]
    ]
    assert finishes == ["stop"]
    assert fronted.audit_row(request_id).outcome == "ok"
