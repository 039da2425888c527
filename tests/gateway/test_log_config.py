"""The log format: one JSON object a line unless a person watches a terminal, and
`BASTION_LOG_JSON` (read by `Settings`) to choose."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from gateway.log_config import configure_logging
from gateway.settings import REPO_ROOT, Settings


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


def test_json_logs_by_default_where_the_output_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("BASTION_LOG_JSON", raising=False)
    configure_logging(Settings().log_json)
    structlog.get_logger("test").info("gateway.hello", n=1)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line)["event"] == "gateway.hello"


@pytest.mark.parametrize("value", ["0", "false"])
def test_key_value_logs_when_asked(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BASTION_LOG_JSON", value)
    configure_logging(Settings().log_json)
    structlog.get_logger("test").info("gateway.hello", n=1)
    line = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err.strip().splitlines()[-1])
    assert "gateway.hello" in line and "n=1" in line and not line.startswith("{")


LOG_ONE_EVENT = """
import structlog
from gateway.log_config import configure_logging
from gateway.settings import REPO_ROOT, Settings
configure_logging(Settings().log_json)
structlog.get_logger("test").info("gateway.hello", n=1)
"""


def test_readable_logs_by_default_at_a_terminal(tmp_path: Path) -> None:
    """stdout and stderr on a pseudo-terminal, as `bastion serve` in a shell has them."""
    controller, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "BASTION_LOG_JSON"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["BASTION_DATA_DIR"] = str(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-c", LOG_ONE_EVENT],
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        env=env,
        cwd=REPO_ROOT,
    )
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal's other end closed: the process is done
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert process.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", output.decode(errors="replace"))
    line = next(line for line in text.splitlines() if "gateway.hello" in line)
    assert "n=1" in line and not line.lstrip().startswith("{")
