"""Admin actions that are no HTTP request (the CLI, the policy watcher) follow the same
audit conventions as those over HTTP (gateway/audit/entries.py)."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from gateway.audit.entries import admin_action_entry
from gateway.cli import main


def test_an_action_without_a_request_gets_its_own_id_and_no_status() -> None:
    first = admin_action_entry(event="e", actor="cli:x", endpoint="cli", details={"a": 1})
    second = admin_action_entry(event="e", actor="cli:x", endpoint="cli")
    assert first.request_id.startswith("act_") and first.request_id != second.request_id
    assert (first.status_code, first.outcome) == (0, "ok")
    assert first.details == {"actor": "cli:x", "a": 1}


def test_a_cli_action_is_audited_with_the_conventions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BASTION_DATA_DIR", str(tmp_path / "data"))
    assert main(["keys", "create", "--tenant", "acme", "--role", "user"]) == 0
    capsys.readouterr()
    assert main(["audit", "query", "--event", "admin.key_created"]) == 0
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["request_id"].startswith("act_")
    assert (record["endpoint"], record["status_code"], record["tenant"]) == ("cli", 0, "acme")
    assert record["details"]["actor"] == f"cli:{getpass.getuser()}"
