"""How `BASTION_ENGINE_WEIGHTS`, `BASTION_ENGINE_THREADS` and the device choose the engine's
weights and threads."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from engine.linear import fbgemm_supported
from engine.native_decode import load_library
from gateway.services import engine_config
from gateway.settings import Settings


@pytest.mark.parametrize(
    ("weights", "device", "expected"),
    [
        ("auto", "cpu", "int8" if load_library() or not fbgemm_supported() else "fp16"),
        ("auto", "cuda", "float"),
        ("float", "cpu", "float"),
        ("int8", "cuda", "int8"),
        ("w8a8", "cpu", "w8a8"),
    ],
)
def test_weights_setting_and_device(weights: str, device: str, expected: str) -> None:
    settings = Settings(engine_weights=weights, kv_cache_mb=96)  # type: ignore[arg-type]
    config = engine_config(settings, device)
    assert config.weights == expected
    assert config.kv_cache_mb == 96


def test_auto_weights_fall_back_to_fp16_without_the_native_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BASTION_NATIVE_DECODE", "0")
    load_library.cache_clear()
    try:
        expected = "fp16" if fbgemm_supported() else "int8"
        assert engine_config(Settings(), "cpu").weights == expected
    finally:
        monkeypatch.delenv("BASTION_NATIVE_DECODE")
        load_library.cache_clear()


def test_unknown_weights_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASTION_ENGINE_WEIGHTS", "int4")
    with pytest.raises(ValidationError, match="engine_weights"):
        Settings()


def test_threads_setting_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine_config(Settings(), "cpu").threads_for("cpu") == os.cpu_count()
    monkeypatch.setenv("BASTION_ENGINE_THREADS", "2")
    config = engine_config(Settings(), "cpu")
    assert config.num_threads == 2 and config.threads_for("cpu") == 2


def test_zero_threads_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASTION_ENGINE_THREADS", "0")
    with pytest.raises(ValidationError, match="engine_threads"):
        Settings()
