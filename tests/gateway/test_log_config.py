"""`BASTION_LOG_JSON` (read by `Settings`) switches the logs to one JSON object a line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import structlog

from gateway.log_config import configure_logging
from gateway.settings import Settings


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.mark.parametrize("value", ["1", "true"])
def test_json_logs(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BASTION_LOG_JSON", value)
    configure_logging(Settings().log_json)
    structlog.get_logger("test").info("gateway.hello", n=1)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line) | {"timestamp": None} == {
        "event": "gateway.hello",
        "n": 1,
        "level": "info",
        "timestamp": None,
    }


def test_key_value_logs_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("BASTION_LOG_JSON", raising=False)
    configure_logging(Settings().log_json)
    structlog.get_logger("test").info("gateway.hello", n=1)
    line = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err.strip().splitlines()[-1])
    assert "gateway.hello" in line and "n=1" in line and not line.startswith("{")
