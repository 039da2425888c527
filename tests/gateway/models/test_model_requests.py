"""How a request's model picks its engine, and how upstream failures read to the client."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import UnsupportedParameter, UpstreamConfig, UpstreamRejected, UpstreamUnavailable
from gateway.http.errors import ApiError
from gateway.http.model_requests import engine_refusal, model_engine, refusing_upstream
from gateway.models import ModelRegistry
from gateway.policy.schema import ModelLimits
from tests.gateway.models.test_registry import RecordingEngine, models_yaml, rewrite


@pytest.fixture
def registry(tmp_path: Path) -> ModelRegistry:
    path = tmp_path / "models.yaml"
    rewrite(path, models_yaml("big"))

    def build(config: UpstreamConfig) -> RecordingEngine:
        return RecordingEngine(config.model_id, config)

    models = ModelRegistry(path, RecordingEngine("SmolLM2"), build)
    models.reload(actor="startup")
    return models


def test_the_policy_may_narrow_the_models(registry: ModelRegistry) -> None:
    anything = ModelLimits()
    assert model_engine(registry, "big", anything).model_id == "big"
    assert model_engine(registry, None, anything).model_id == "SmolLM2"
    narrow = ModelLimits(allowed_models=["SmolLM2"])
    assert model_engine(registry, "SmolLM2", narrow).model_id == "SmolLM2"
    with pytest.raises(ApiError) as caught:
        model_engine(registry, "big", narrow)
    assert (caught.value.status, caught.value.code, caught.value.param) == (
        403,
        "model_not_allowed",
        "model",
    )
    assert "'big'" in caught.value.message and "Allowed: SmolLM2" in caught.value.message
    with pytest.raises(ApiError) as caught:
        model_engine(registry, "gpt-4", anything)
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")
    assert "Available: SmolLM2, big" in caught.value.message


@pytest.mark.parametrize(
    ("status", "code"),
    [(502, "upstream_unavailable"), (503, "upstream_unavailable"), (504, "upstream_timeout")],
)
def test_an_unavailable_upstream_is_its_status_with_retry_after(status: int, code: str) -> None:
    failure = UpstreamUnavailable(
        "no answer",
        status=status,  # type: ignore[arg-type]
        upstream="http://vllm-0:8000/v1",
        retry_after_s=7.4,
    )
    error = engine_refusal(failure, "messages")
    assert (error.status, error.code, error.type) == (status, code, "server_error")
    assert error.headers == {"retry-after": "7"}
    assert error.body()["error"]["message"] == "no answer"
    assert refusing_upstream(failure) == "http://vllm-0:8000/v1"


def test_an_upstreams_own_refusal_and_an_unsupported_parameter_are_the_clients() -> None:
    rejected = engine_refusal(UpstreamRejected("too long", status=413, upstream="u"), "messages")
    assert (rejected.status, rejected.code) == (413, "upstream_rejected")
    unsupported = engine_refusal(UnsupportedParameter("logit_bias", "not here"), "messages")
    assert (unsupported.status, unsupported.param) == (400, "logit_bias")
    assert refusing_upstream(UnsupportedParameter("logit_bias", "x")) is None
