"""A Bastion whose models file turns the embedded model off: it never loads it, serves only
the upstream model (here llama-server), and refuses a later edit that turns it back on."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI

from engine import default_model_source
from gateway.keys.store import create_key
from gateway.services import Services, load_services
from gateway.settings import REPO_ROOT, Settings
from tests.support.llama_server import MODEL_ALIAS, LlamaServer, running_llama_server
from tests.support.local_server import free_port, serve_in_thread

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
    data_dir = tmp_path_factory.mktemp("bastion-upstream-only")
    policy_dir = tmp_path_factory.mktemp("policies-upstream-only")
    shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
    models_file = data_dir / "models.yaml"
    models_file.write_text(MODELS.format(url=llama_server.base_url))
    settings = Settings(
        data_dir=data_dir,
        port=free_port(),
        policy_dir=policy_dir,
        policy_reload_seconds=0.2,
        models_file=models_file,
        sample_corpus=None,
    )
    services = load_services(settings)  # no engine given: the embedded one is not loaded
    secret, _ = create_key(services.sessions, settings.default_tenant, "user")
    with serve_in_thread(settings, services) as base_url:
        client = OpenAI(base_url=f"{base_url}/v1", api_key=secret, max_retries=0, timeout=120)
        yield base_url, services, client


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
