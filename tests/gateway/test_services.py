"""How `BASTION_ENGINE_WEIGHTS`, `BASTION_ENGINE_THREADS`, `BASTION_ENGINE_MAX_SEQS`,
`BASTION_KV_CACHE_MB` and the native decode settings reach the engine's config (the engine
resolves `auto` weights itself: tests/engine/test_config.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from engine import WeightChoice, resolve_engine_config
from gateway.services import engine_config
from gateway.settings import Settings


@pytest.mark.parametrize("weights", ["auto", "float", "int8", "w8a8", "fp16"])
def test_weights_setting_reaches_the_engine(weights: str) -> None:
    settings = Settings(engine_weights=weights, kv_cache_mb=96)  # type: ignore[arg-type]
    config = engine_config(settings)
    assert config.weights == weights
    assert config.kv_cache_mb == 96


def test_auto_weights_are_resolved_for_the_device() -> None:
    config = engine_config(Settings())
    assert resolve_engine_config(config, "cuda").weights == "float"
    assert resolve_engine_config(config, "cpu").weights in ("int8", "fp16")


def test_kv_cache_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    default = engine_config(Settings()).kv_cache_mb
    monkeypatch.setenv("BASTION_KV_CACHE_MB", "64")
    assert engine_config(Settings()).kv_cache_mb == 64 != default
    for refused in ("8", "lots"):
        monkeypatch.setenv("BASTION_KV_CACHE_MB", refused)
        with pytest.raises(ValidationError, match="kv_cache_mb"):
            Settings()


def test_native_decode_settings_reach_the_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert engine_config(Settings()).native_decode is True
    monkeypatch.setenv("BASTION_NATIVE_DECODE", "0")
    monkeypatch.setenv("BASTION_NATIVE_CACHE_DIR", str(tmp_path))
    config = engine_config(Settings())
    assert config.native_decode is False and config.native_cache_dir == tmp_path


def test_the_weights_setting_offers_what_the_engine_accepts() -> None:
    """Settings keeps its own list (importing the engine would load PyTorch for every
    CLI command); this keeps the two the same."""
    offered = get_args(Settings.model_fields["engine_weights"].annotation)
    accepted = get_args(WeightChoice)
    flattened = {name for part in accepted for name in (get_args(part) or (part,))}
    assert set(offered) == flattened


def test_unknown_weights_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASTION_ENGINE_WEIGHTS", "int4")
    with pytest.raises(ValidationError, match="engine_weights"):
        Settings()


def test_threads_setting_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine_config(Settings()).threads_for("cpu") == os.cpu_count()
    monkeypatch.setenv("BASTION_ENGINE_THREADS", "2")
    config = engine_config(Settings())
    assert config.num_threads == 2 and config.threads_for("cpu") == 2


def test_max_seqs_setting_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine_config(Settings()).max_num_seqs == 64
    monkeypatch.setenv("BASTION_ENGINE_MAX_SEQS", "16")
    assert engine_config(Settings()).max_num_seqs == 16
    for refused in ("0", "513"):  # more than the per-step budget could ever decode
        monkeypatch.setenv("BASTION_ENGINE_MAX_SEQS", refused)
        with pytest.raises(ValidationError, match="engine_max_seqs"):
            Settings()


def test_zero_threads_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASTION_ENGINE_THREADS", "0")
    with pytest.raises(ValidationError, match="engine_threads"):
        Settings()


def test_speculation_is_on_by_default_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert engine_config(Settings()).speculative_tokens == 7  # the longest draft
    monkeypatch.setenv("BASTION_SPECULATIVE_TOKENS", "0")
    assert engine_config(Settings()).speculative_tokens == 0
    monkeypatch.setenv("BASTION_SPECULATIVE_TOKENS", "-1")
    with pytest.raises(ValidationError):
        Settings()
