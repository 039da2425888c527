"""Prefix-cache hits reported as OpenAI reports them (`usage.prompt_tokens_details
.cached_tokens`), in the audit record and in `/metrics`, by the real engine: a request
whose long system message an earlier one sent reads it from the cache, even though the
two retrieved different sources."""

from __future__ import annotations

import uuid

import httpx
from openai import OpenAI
from openai.types import CompletionUsage

from engine import EngineConfig
from tests.integration.conftest import LiveServer
from tests.integration.test_metrics import metric

MODEL = "SmolLM2-135M-Instruct"
BLOCK = EngineConfig().block_size
QUESTIONS = (
    "How many days of paid vacation do employees get each year?",
    "How do I connect to the VPN from home?",
    "When are expense reports due?",
)


FACTS = (
    "Northwind Traders sells tea, coffee and spices to shops across Europe.",
    "The head office is in Lyon and the warehouse is near the river port.",
    "Staff work flexible hours between seven in the morning and seven in the evening.",
    "The canteen serves lunch from noon until two, with a vegetarian dish every day.",
    "Team meetings take place on Monday mornings and last about thirty minutes.",
    "New employees meet their mentor during the first week and visit the warehouse.",
    "The library on the second floor lends books about logistics and trade.",
    "Parking spaces are shared, and bicycles can be kept in the courtyard.",
)


def long_system_message() -> str:
    """A system message no earlier request sent (its number is new), ~500 tokens; plain
    facts, which the injection classifier lets through (a hex id would look obfuscated)."""
    number = uuid.uuid4().int % 10**9
    return f"Notes for conversation {number} about Northwind Traders. " + " ".join(FACTS * 4)


def cached(usage: CompletionUsage | None) -> int:
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None
    return usage.prompt_tokens_details.cached_tokens


def cached_metric(live_server: LiveServer) -> float:
    text = httpx.get(f"{live_server.base_url}/metrics", timeout=10).text
    return metric(text, "bastion_tokens_total", kind="cached_prompt")


def test_a_shared_system_message_is_served_from_the_cache(
    client: OpenAI, live_server: LiveServer
) -> None:
    system = long_system_message()
    system_tokens = live_server.engine.count_text_tokens(system)
    counted_before = cached_metric(live_server)
    usages, request_ids = [], []
    for question in QUESTIONS[:2]:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=4,
            temperature=0,
        )
        usages.append(raw.parse().usage)
        request_ids.append(raw.headers["x-request-id"])
    first, second = (cached(u) for u in usages)
    prompts = [live_server.engine.received[r][0].content for r in request_ids]
    assert prompts[0] != prompts[1]  # different sources after the shared part
    assert first < system_tokens  # at most the policy's prompt was cached before
    assert second >= system_tokens // BLOCK * BLOCK and second > first
    assert second <= usages[1].prompt_tokens  # type: ignore[union-attr]
    for request_id, hits in zip(request_ids, (first, second), strict=True):
        rows = live_server.audit_rows(request_id)
        assert len(rows) == 1 and rows[0].details["cached_prompt_tokens"] == hits
    assert cached_metric(live_server) >= counted_before + first + second


def test_the_streamed_usage_chunk_reports_cached_tokens(
    client: OpenAI, live_server: LiveServer
) -> None:
    system = long_system_message()
    system_tokens = live_server.engine.count_text_tokens(system)
    hits = []
    for question in QUESTIONS[1:]:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert chunks[-1].choices == []
        assert all(c.usage is None for c in chunks[:-1])
        hits.append(cached(chunks[-1].usage))
    assert hits[0] < system_tokens
    assert hits[1] >= system_tokens // BLOCK * BLOCK


def test_text_completions_report_cached_tokens(client: OpenAI, live_server: LiveServer) -> None:
    shared = long_system_message()
    shared_tokens = live_server.engine.count_text_tokens(shared)
    counted_before = cached_metric(live_server)
    first = client.completions.create(
        model=MODEL, prompt=shared + "\nQ: Vacation days?\nA:", max_tokens=3, temperature=0
    )
    with_raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=shared + "\nQ: VPN setup?\nA:", max_tokens=3, temperature=0
    )
    second = with_raw.parse()
    assert cached(first.usage) == 0
    assert cached(second.usage) >= (shared_tokens - BLOCK) // BLOCK * BLOCK > 0
    streamed = client.completions.create(
        model=MODEL,
        prompt=shared + "\nQ: Expenses?\nA:",
        max_tokens=3,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert cached(list(streamed)[-1].usage) == cached(second.usage)
    rows = live_server.audit_rows(with_raw.headers["x-request-id"])
    assert rows[0].details["cached_prompt_tokens"] == cached(second.usage)
    assert cached_metric(live_server) >= counted_before + 2 * cached(second.usage)
