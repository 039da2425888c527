"""`/metrics` of a live server carries what the Gateway API Inference Extension's endpoint
picker reads from a model server, under vLLM's names, types and `model_name` label, and
the values follow the engine."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine import ChatMessage, GenerationRequest, SamplingParams
from gateway.services import engine_config
from tests.integration.conftest import LiveServer

# name -> type, as the endpoint picker parses them (it reads a gauge's value).
ROUTING_METRICS = {
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
}


def scrape(live_server: LiveServer) -> dict[str, tuple[str, dict[str, float]]]:
    """Each family of `/metrics`: its type, and its samples' values by sample name and
    labels (`name{label="value"}`)."""
    text = httpx.get(f"{live_server.base_url}/metrics", timeout=10).text
    families: dict[str, tuple[str, dict[str, float]]] = {}
    for family in text_string_to_metric_families(text):
        samples = {
            s.name + "".join(f'{{{k}="{v}"}}' for k, v in sorted(s.labels.items())): s.value
            for s in family.samples
        }
        families[family.name] = (family.type, samples)
    return families


def value(families: dict[str, tuple[str, dict[str, float]]], name: str, model: str) -> float:
    sample = f"{name}_total" if families[name][0] == "counter" else name
    return families[name][1][f'{sample}{{model_name="{model}"}}']


def engine_field(families: dict[str, tuple[str, dict[str, float]]], field: str) -> float:
    return families["bastion_engine"][1][f'bastion_engine{{field="{field}"}}']


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_the_routing_metrics_have_vllm_names_types_and_the_served_model(
    live_server: LiveServer,
) -> None:
    families = scrape(live_server)
    served = httpx.get(
        f"{live_server.base_url}/v1/models",
        headers={"authorization": f"Bearer {live_server.api_key}"},
        timeout=10,
    ).json()["data"]
    model = served[0]["id"]
    for name, kind in ROUTING_METRICS.items():
        assert families[name][0] == kind, name
        value(families, name, model)  # present, labelled with the model clients ask for
    # One snapshot feeds both: the vLLM names and bastion_engine agree.
    assert value(families, "vllm:num_requests_waiting", model) == engine_field(families, "waiting")
    assert value(families, "vllm:num_requests_running", model) == engine_field(families, "running")
    usage = engine_field(families, "kv_blocks_used") / engine_field(families, "kv_blocks_total")
    assert value(families, "vllm:kv_cache_usage_perc", model) == usage
    assert value(families, "vllm:gpu_cache_usage_perc", model) == usage
    assert value(families, "vllm:prefix_cache_hits", model) == engine_field(
        families, "prefix_cache_hit_tokens"
    )


def test_running_waiting_and_kv_use_follow_the_engine(live_server: LiveServer) -> None:
    """More streams than the engine batches at once: some run, the rest wait."""
    model = live_server.engine.model_id
    # A few streams past the batch would wait only for a moment, which scrapes can miss.
    streams = engine_config(live_server.settings).max_num_seqs + 24
    seen = {"running": 0.0, "waiting": 0.0, "usage": 0.0}
    done = threading.Event()

    async def generate_many() -> None:
        async def one(i: int) -> None:
            request = GenerationRequest(
                request_id=f"routing_{uuid.uuid4().hex}",
                messages=(ChatMessage("user", f"Count from {i} to {i + 40}."),),
                sampling=SamplingParams(max_tokens=8),
            )
            async for _ in live_server.engine.stream(request):
                pass

        await asyncio.gather(*(one(i) for i in range(streams)))

    def load() -> None:
        try:
            asyncio.run(generate_many())
        finally:
            done.set()

    threading.Thread(target=load, daemon=True).start()

    def observed_load() -> bool:
        families = scrape(live_server)
        seen["running"] = max(seen["running"], value(families, "vllm:num_requests_running", model))
        seen["waiting"] = max(seen["waiting"], value(families, "vllm:num_requests_waiting", model))
        seen["usage"] = max(seen["usage"], value(families, "vllm:kv_cache_usage_perc", model))
        return seen["running"] >= 1 and seen["waiting"] >= 1 and seen["usage"] > 0

    assert wait_for(observed_load, 60), seen
    assert 0 < seen["usage"] <= 1
    assert done.wait(120)

    def idle() -> bool:
        families = scrape(live_server)
        return (
            value(families, "vllm:num_requests_running", model) == 0
            and value(families, "vllm:num_requests_waiting", model) == 0
        )

    assert wait_for(idle, 10)


def test_prefix_cache_counters_count_a_repeated_prompt(live_server: LiveServer) -> None:
    model = live_server.engine.model_id
    before = scrape(live_server)
    prompt = "Summarise the remote-work policy. " * 12  # several blocks of 16 tokens
    for _ in range(2):
        response = httpx.post(
            f"{live_server.base_url}/v1/chat/completions",
            headers={"authorization": f"Bearer {live_server.api_key}"},
            json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 1},
            timeout=120,
        )
        assert response.status_code == 200
        cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    after = scrape(live_server)
    hits = value(after, "vllm:prefix_cache_hits", model)
    queries = value(after, "vllm:prefix_cache_queries", model)
    assert cached >= 16, "the second request found no cached prefix"
    assert hits - value(before, "vllm:prefix_cache_hits", model) >= cached
    assert queries - value(before, "vllm:prefix_cache_queries", model) >= 2 * cached
    assert hits <= queries
