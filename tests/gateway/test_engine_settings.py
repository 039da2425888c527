"""How `BASTION_ENGINE_WEIGHTS` and the device choose the engine's weights."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.services import engine_config
from gateway.settings import Settings


@pytest.mark.parametrize(
    ("weights", "device", "int8"),
    [
        ("auto", "cpu", True),
        ("auto", "cuda", False),
        ("float", "cpu", False),
        ("int8", "cuda", True),
    ],
)
def test_weights_setting_and_device(weights: str, device: str, int8: bool) -> None:
    settings = Settings(engine_weights=weights, kv_cache_mb=96)  # type: ignore[arg-type]
    config = engine_config(settings, device)
    assert config.int8_weights is int8
    assert config.kv_cache_mb == 96


def test_unknown_weights_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASTION_ENGINE_WEIGHTS", "int4")
    with pytest.raises(ValidationError, match="engine_weights"):
        Settings()
