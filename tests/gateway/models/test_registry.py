"""The models registry: lookups by id, hot reload that keeps the last good file, and
engines of removed models closed."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from engine import ChatMessage, Engine, GenerationRequest, TokenDelta, UpstreamConfig
from gateway.models import ModelRegistry, ModelsFileError, UnknownModel
from tests.support.configmap_volume import ConfigMapVolume


class RecordingEngine:
    """An engine that serves nothing and remembers whether it was closed."""

    def __init__(self, model_id: str, config: UpstreamConfig | None = None) -> None:
        self._model_id = model_id
        self.config = config
        self.closed = False

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def context_window(self) -> int:
        return 2048

    @property
    def vocab_size(self) -> int:
        return 0

    def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        return 0

    def count_text_tokens(self, text: str) -> int:
        return 0

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        raise NotImplementedError
        yield  # pragma: no cover

    def close(self) -> None:
        self.closed = True


def upstream(config: UpstreamConfig) -> Engine:
    return RecordingEngine(config.model_id, config)


def models_yaml(*ids: str, url: str = "http://a:1/v1", embedded: bool = True) -> str:
    entries = "".join(
        f"  - id: {model_id}\n    upstream:\n      base_urls: [{url}]\n      model: m\n"
        for model_id in ids
    )
    entries = entries or "  []\n"
    return f"models:\n{entries}embedded: {str(embedded).lower()}\n"


def rewrite(path: Path, text: str) -> None:
    """Write `text` so that the registry sees a change even within one clock tick."""
    stat = path.stat() if path.exists() else None
    path.write_text(text)
    if stat is not None:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


@pytest.fixture
def embedded() -> RecordingEngine:
    return RecordingEngine("SmolLM2")


def test_lookups_cover_the_embedded_and_upstream_models(
    tmp_path: Path, embedded: RecordingEngine
) -> None:
    path = tmp_path / "models.yaml"
    rewrite(path, models_yaml("big", "small"))
    registry = ModelRegistry(path, embedded, upstream)
    assert registry.reload(actor="startup")
    assert registry.model_ids() == ["SmolLM2", "big", "small"]
    assert [e.model_id for e in registry.engines()] == registry.model_ids()
    assert registry.engine_for("SmolLM2") is embedded
    assert registry.engine_for(None) is embedded
    assert registry.engine_for("big").model_id == "big"
    with pytest.raises(UnknownModel, match=r"'gpt-4' does not exist\. Available: SmolLM2, big"):
        registry.engine_for("gpt-4")


def test_the_embedded_model_can_be_turned_off(tmp_path: Path, embedded: RecordingEngine) -> None:
    path = tmp_path / "models.yaml"
    rewrite(path, models_yaml("big", embedded=False))
    registry = ModelRegistry(path, embedded, upstream)
    registry.reload(actor="startup")
    assert registry.model_ids() == ["big"]
    assert registry.engine_for(None).model_id == "big"
    with pytest.raises(UnknownModel):
        registry.engine_for("SmolLM2")


def test_without_a_file_only_the_embedded_model_is_served(embedded: RecordingEngine) -> None:
    registry = ModelRegistry(None, embedded, upstream)
    assert registry.reload(actor="startup") is False
    assert registry.model_ids() == ["SmolLM2"]


def test_a_bad_file_at_start_up_is_an_error(tmp_path: Path, embedded: RecordingEngine) -> None:
    path = tmp_path / "models.yaml"
    rewrite(path, "models:\n  - id: x\n")
    with pytest.raises(ModelsFileError, match="line 2"):
        ModelRegistry(path, embedded, upstream).reload(actor="startup")


def test_a_good_edit_is_picked_up_and_removed_models_are_closed(
    tmp_path: Path, embedded: RecordingEngine
) -> None:
    path = tmp_path / "models.yaml"
    rewrite(path, models_yaml("big", "small"))
    registry = ModelRegistry(path, embedded, upstream)
    registry.reload(actor="startup")
    big, small = registry.engine_for("big"), registry.engine_for("small")
    assert registry.reload() is False  # nothing changed
    rewrite(path, models_yaml("big", "new"))
    assert registry.reload()
    assert registry.model_ids() == ["SmolLM2", "big", "new"]
    assert registry.engine_for("big") is big  # unchanged: the same engine, not closed
    assert isinstance(big, RecordingEngine) and not big.closed
    assert isinstance(small, RecordingEngine) and small.closed
    rewrite(path, models_yaml("big", "new", url="http://b:2/v1"))
    assert registry.reload()
    assert isinstance(big, RecordingEngine) and big.closed  # changed: a new engine for it
    assert registry.engine_for("big") is not big
    registry.close()
    assert all(
        isinstance(e, RecordingEngine) and e.closed
        for e in (registry.engine_for("big"), registry.engine_for("new"))
    )
    assert not embedded.closed  # the embedded engine is its owner's to close


def test_a_bad_edit_keeps_the_last_good_version(tmp_path: Path, embedded: RecordingEngine) -> None:
    path = tmp_path / "models.yaml"
    rewrite(path, models_yaml("big"))
    registry = ModelRegistry(path, embedded, upstream)
    registry.reload(actor="startup")
    good = registry.version
    rewrite(path, models_yaml("big").replace("model: m", "modle: m"))
    assert registry.reload() is False
    assert registry.model_ids() == ["SmolLM2", "big"]
    assert registry.version == good
    assert registry.reload_failures == 1
    assert registry.error is not None and "line 5" in registry.error
    assert registry.reload() is False and registry.reload_failures == 1  # reported once
    path.unlink()
    assert registry.reload() is False and registry.reload_failures == 2
    assert registry.engine_for("big").model_id == "big"
    rewrite(path, models_yaml("big", "small"))
    assert registry.reload()
    assert registry.error is None
    assert registry.model_ids() == ["SmolLM2", "big", "small"]


def test_a_configmap_update_of_the_models_file_is_picked_up(
    tmp_path: Path, embedded: RecordingEngine
) -> None:
    """The kubelet's update swaps `..data` to a new file of the same size and time."""
    volume = ConfigMapVolume(tmp_path, {"models.yaml": models_yaml("big")})
    registry = ModelRegistry(tmp_path / "models.yaml", embedded, upstream)
    registry.reload(actor="startup")
    assert registry.model_ids() == ["SmolLM2", "big"]
    volume.update({"models.yaml": models_yaml("bog")}, same_times=True)
    registry.reload()
    assert registry.model_ids() == ["SmolLM2", "bog"]
