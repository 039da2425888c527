"""A Bastion whose models file turns the embedded model off: it never loads it, serves only
the upstream model (here llama-server), and refuses a later edit that turns it back on."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI

from engine import default_model_source
from gateway.services import Services
from tests.support.llama_server import MODEL_ALIAS, LlamaServer, running_llama_server
from tests.support.upstream_front import upstream_front

MODELS = f"""\
models:
  - id: smol-upstream
    upstream:
      base_urls: ["{{url}}"]
      model: {MODEL_ALIAS}
      tokenizer: estimate
embedded: false
"""


@pytest.fixture(scope="module")
def llama_server() -> Iterator[LlamaServer]:
    with running_llama_server() as server:
        yield server


@pytest.fixture(scope="module")
def upstream_only(
    tmp_path_factory: pytest.TempPathFactory, llama_server: LlamaServer
) -> Iterator[tuple[str, Services, OpenAI]]:
    folder = tmp_path_factory.mktemp("bastion-upstream-only")
    models = MODELS.format(url=llama_server.base_url)
    with upstream_front(folder, models, policy_reload_seconds=0.2) as front:
        client = OpenAI(
            base_url=f"{front.base_url}/v1", api_key=front.secret, max_retries=0, timeout=120
        )
        yield front.base_url, front.services, client


def test_only_the_upstream_model_is_loaded_and_served(
    upstream_only: tuple[str, Services, OpenAI],
) -> None:
    base_url, services, client = upstream_only
    assert services.engine is None
    ready = httpx.get(f"{base_url}/readyz", timeout=10).json()
    assert ready["status"] == "ready" and ready["models"] == ["smol-upstream"]
    assert [model.id for model in client.models.list()] == ["smol-upstream"]
    answer = client.chat.completions.create(
        messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, model=""
    )
    assert answer.model == "smol-upstream" and answer.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model=default_model_source().model_id,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
        )
    assert httpx.get(f"{base_url}/metrics", timeout=10).status_code == 200


def test_turning_the_embedded_model_on_needs_a_restart(
    upstream_only: tuple[str, Services, OpenAI],
) -> None:
    _, services, client = upstream_only
    path = services.settings.models_file
    assert path is not None
    original = path.read_text()
    failures = services.models.reload_failures
    try:
        path.write_text(original.replace("embedded: false", "embedded: true"))
        deadline = time.monotonic() + 10
        while services.models.reload_failures == failures:
            assert time.monotonic() < deadline, "the edit was not looked at"
            time.sleep(0.05)
        assert services.models.error is not None and "needs a restart" in services.models.error
        assert [model.id for model in client.models.list()] == ["smol-upstream"]
    finally:
        path.write_text(original)
