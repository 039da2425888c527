"""`bastion models check FILE`: OK on a good file; on a bad one each error by line, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main

GOOD = """\
models:
  - id: llama-70b
    upstream:
      base_urls: ["http://vllm-0:8000/v1"]
      model: meta-llama/Llama-3.1-70B-Instruct
      api_key_env: BASTION_TEST_UNSET_KEY
"""


def test_a_good_file_passes_without_its_keys_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BASTION_TEST_UNSET_KEY", raising=False)
    path = tmp_path / "models.yaml"
    path.write_text(GOOD)
    assert main(["models", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: ok (1 upstream models: llama-70b; embedded served" in out


def test_a_bad_file_prints_each_error_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(GOOD.replace("http://vllm-0", "vllm-0") + "  - id: llama-70b\n")
    assert main(["models", "check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: line 4, column 18: models.0.upstream.base_urls:" in err
    assert "base_urls: 'vllm-0:8000/v1' is not an http(s) URL" in err
    assert f"{path}: line 7, column 5: models.1.upstream: required field is missing" in err


def test_an_id_that_takes_the_embedded_models_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine import default_model_source

    path = tmp_path / "models.yaml"
    path.write_text(GOOD.replace("llama-70b", default_model_source().model_id))
    assert main(["models", "check", str(path)]) == 1
    assert "is the embedded model's id" in capsys.readouterr().err
