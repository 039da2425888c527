"""What `bastion serve` does once its services have loaded in the background: the heap
they made is frozen (out of the collector's full passes) as the app turns ready."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.datastructures import State

from gateway import app as app_module
from gateway.settings import Settings


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test process collects as before


def _load_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, load: Any) -> Litestar:
    monkeypatch.setattr(app_module, "load_services", load)
    app = Litestar(state=State({"services": None, "load_error": None}))
    asyncio.run(app_module._load_in_background(app, Settings(data_dir=tmp_path)))
    return app


def test_the_loaded_heap_is_frozen_and_the_services_published(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class Loaded:
        """Stands for the services: what matters is when the app gets them."""

    def load(_: Settings) -> Loaded:
        assert gc.get_freeze_count() == 0
        return Loaded()

    app = _load_with(monkeypatch, tmp_path, load)
    assert isinstance(app.state.services, Loaded)
    assert gc.get_freeze_count() > 0


def test_a_failed_load_is_reported_and_nothing_is_frozen(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def load(_: Settings) -> None:
        raise FileNotFoundError("no model here")

    app = _load_with(monkeypatch, tmp_path, load)
    assert app.state.services is None
    assert app.state.load_error == "FileNotFoundError: no model here"
    assert gc.get_freeze_count() == 0
