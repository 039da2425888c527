"""The models file: a good one loads into upstream configs; each bad edit names its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import UpstreamTimeouts
from gateway.models import ModelsFileError, load_models_file

GOOD = """\
models:
  - id: llama-70b
    upstream:
      base_urls: ["http://vllm-0:8000/v1", "http://vllm-1:8000/v1/"]
      model: meta-llama/Llama-3.1-70B-Instruct
      api_key_env: BASTION_TEST_VLLM_KEY
      timeouts: {connect: 2, first_token: 30, idle: 10, total: 300}
      max_concurrency: 8
      context_window: 8192
      tokenizer: estimate
      forward_cache_salt: true
  - id: small
    upstream:
      base_urls: ["https://nim.example.com/v1"]
      model: smollm2
      resilience: {max_retries: 1, health_interval_s: 2, circuit_failures: 3, circuit_reset_s: 15}
embedded: false
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def issue_of(path: Path, **kwargs: object) -> tuple[int | None, str, str]:
    with pytest.raises(ModelsFileError) as caught:
        load_models_file(path, **kwargs)  # type: ignore[arg-type]
    issue = caught.value.issues[0]
    assert str(path) in str(caught.value)
    return issue.line, issue.field, issue.message


def test_a_good_file_becomes_upstream_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASTION_TEST_VLLM_KEY", "secret")
    loaded = load_models_file(write(tmp_path, GOOD), embedded_id="SmolLM2")
    big, small = loaded.upstreams
    assert big.model_id == "llama-70b"
    assert big.base_urls == ("http://vllm-0:8000/v1", "http://vllm-1:8000/v1")
    assert big.upstream_model == "meta-llama/Llama-3.1-70B-Instruct"
    assert big.timeouts == UpstreamTimeouts(connect=2, first_token=30, idle=10, total=300)
    assert (big.max_concurrency, big.context_window, big.tokenizer) == (8, 8192, "estimate")
    assert big.forward_cache_salt and big.api_key_env == "BASTION_TEST_VLLM_KEY"
    assert (big.max_retries, big.circuit_failures) == (2, 5)  # the defaults
    assert small.context_window is None and small.tokenizer == "upstream"
    assert (small.max_retries, small.health_interval_s) == (1, 2)
    assert (small.circuit_failures, small.circuit_reset_s) == (3, 15)
    assert loaded.embedded is False
    assert len(loaded.version) == 64


def test_an_unknown_key_names_its_line_and_a_near_field(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("max_concurrency: 8", "max_concurency: 8"))
    line, field, message = issue_of(path, check_env=False)
    assert (line, field) == (8, "models.0.upstream.max_concurency")
    assert "did you mean 'max_concurrency'?" in message


def test_a_missing_field_names_the_model(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  - id: x\n    upstream:\n      base_urls: [http://a/v1]\n")
    line, field, message = issue_of(path)
    assert (line, field, message) == (4, "models.0.upstream.model", "required field is missing")


def test_a_url_that_is_not_http_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("https://nim.example.com/v1", "ftp://nim/v1"))
    line, field, message = issue_of(path, check_env=False)
    assert (line, field) == (14, "models.1.upstream.base_urls")
    assert "'ftp://nim/v1' is not an http(s) URL" in message


def test_ids_must_be_unique(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("id: small", "id: llama-70b"))
    line, field, message = issue_of(path, check_env=False)
    assert (line, field) == (12, "models.1.id")
    assert "listed twice" in message


def test_an_id_may_not_take_the_embedded_models(tmp_path: Path) -> None:
    served = GOOD.replace("embedded: false", "embedded: true")
    path = write(tmp_path, served.replace("id: small", "id: SmolLM2"))
    line, field, message = issue_of(path, embedded_id="SmolLM2", check_env=False)
    assert (line, field) == (12, "models.1.id")
    assert "embedded model's id" in message
    # With the embedded model off, its id is free.
    write(tmp_path, GOOD.replace("id: small", "id: SmolLM2"))
    assert load_models_file(path, embedded_id="SmolLM2", check_env=False).upstreams


def test_api_key_env_must_be_a_variable_name(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("BASTION_TEST_VLLM_KEY", "not-a-name"))
    line, field, message = issue_of(path, check_env=False)
    assert (line, field) == (6, "models.0.upstream.api_key_env")
    assert "not an environment variable name" in message


def test_api_key_env_must_be_set_at_load_but_not_at_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BASTION_TEST_VLLM_KEY", raising=False)
    path = write(tmp_path, GOOD)
    line, field, message = issue_of(path)
    assert (line, field) == (6, "models.0.upstream.api_key_env")
    assert message == "the environment variable BASTION_TEST_VLLM_KEY is not set"
    assert "secret" not in message
    assert load_models_file(path, check_env=False).upstreams


def test_a_local_tokenizer_needs_its_path(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("tokenizer: estimate", "tokenizer: local"))
    line, field, message = issue_of(path, check_env=False)
    assert (line, field) == (4, "models.0.upstream")
    assert "tokenizer: local needs tokenizer_path" in message


def test_bad_values_and_bad_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("max_concurrency: 8", "max_concurrency: 0"))
    assert issue_of(path, check_env=False)[:2] == (8, "models.0.upstream.max_concurrency")
    path = write(tmp_path, GOOD.replace("tokenizer: estimate", "tokenizer: tiktoken"))
    assert issue_of(path, check_env=False)[:2] == (10, "models.0.upstream.tokenizer")
    path = write(tmp_path, "models: [\n")
    assert issue_of(path)[1] == "(yaml)"
    path = write(tmp_path, "- just a list\n")
    assert issue_of(path)[1:] == ("(root)", "expected a mapping")
