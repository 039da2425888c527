"""`bastion serve`'s early engine load: which models files turn it off, and that the load
on its own thread imports nothing while the main thread imports the gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.engine_loading import start_engine_load, wants_embedded_engine
from gateway.settings import REPO_ROOT, Settings

UPSTREAM = (
    "models:\n  - id: big\n    upstream:\n      base_urls: ['http://a:1/v1']\n      model: m\n"
)


def settings_with_models_file(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return Settings(data_dir=tmp_path / "data", models_file=path)


def test_without_a_models_file_the_embedded_engine_is_served(tmp_path: Path) -> None:
    assert wants_embedded_engine(Settings(data_dir=tmp_path))


def test_a_models_file_decides_whether_the_embedded_engine_is_served(tmp_path: Path) -> None:
    assert wants_embedded_engine(settings_with_models_file(tmp_path, UPSTREAM))
    off = settings_with_models_file(tmp_path, UPSTREAM + "embedded: false\n")
    assert not wants_embedded_engine(off)


def test_a_models_file_that_does_not_load_starts_no_early_load(tmp_path: Path) -> None:
    """`load_services` reports the file's errors; the early load stays out of the way."""
    broken = settings_with_models_file(tmp_path, "models:\n  - id: [\n")
    assert not wants_embedded_engine(broken)
    assert start_engine_load(broken).result(timeout=1) is None


def test_with_the_embedded_engine_off_nothing_loads(tmp_path: Path) -> None:
    off = settings_with_models_file(tmp_path, UPSTREAM + "embedded: false\n")
    assert start_engine_load(off).result(timeout=1) is None


LOAD_IN_A_FRESH_PROCESS = """
import json, sys
from gateway.engine_loading import import_engine_modules, load_engine
from gateway.settings import Settings
import_engine_modules()
before = set(sys.modules)
engine = load_engine(Settings())
print(json.dumps(sorted(set(sys.modules) - before)))
engine.close()
"""


@pytest.mark.slow
def test_loading_the_default_engine_imports_nothing_the_early_imports_missed(
    tmp_path: Path,
) -> None:
    """The engine loads on a thread while the main thread imports presidio, spaCy and the
    web stack: an import on both threads at once could meet a half-initialised module."""
    env = {
        **os.environ,
        "BASTION_DATA_DIR": str(tmp_path),
        "BASTION_KV_CACHE_MB": "16",
        "PYTHONPATH": str(REPO_ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", LOAD_IN_A_FRESH_PROCESS],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    imported_while_loading = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported_while_loading == []
