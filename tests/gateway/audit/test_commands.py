"""`bastion audit purge` and `bastion audit erase` on a data folder, through `main()`."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import structlog

from gateway.audit.chain import Checkpoint
from gateway.audit.log import AuditEntry, AuditLog
from gateway.audit.signing import KEY_FILE_NAME
from gateway.cli import main
from gateway.services import open_database
from gateway.settings import Settings


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """`main()` points structlog at pytest's captured stderr, which is closed afterwards."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("BASTION_DATA_DIR", str(folder))
    monkeypatch.delenv("BASTION_AUDIT_SIGNING_KEY", raising=False)
    return folder


def test_purge_prints_a_signed_checkpoint_that_verifies(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = AuditLog(open_database(Settings(data_dir=data_dir)))
    for n in range(3):
        log.record(AuditEntry(request_id=f"r{n}", endpoint="/x", outcome="ok", status_code=200))
    assert main(["audit", "purge", "--older-than", "1"]) == 0
    assert "nothing to purge" in capsys.readouterr().err
    assert main(["audit", "purge", "--older-than", "0"]) == 0
    out = capsys.readouterr()
    assert "purged records 1..3" in out.err
    checkpoint = Checkpoint.from_json(out.out)
    assert checkpoint.seq == 4 and checkpoint.signature is not None
    assert stat.S_IMODE(os.stat(data_dir / KEY_FILE_NAME).st_mode) == 0o600
    saved = tmp_path / "checkpoint.json"
    saved.write_text(out.out)
    assert main(["audit", "verify", "--checkpoint", str(saved)]) == 0
    assert capsys.readouterr().out.startswith("OK: 1 records")
    saved.write_text(out.out.replace(checkpoint.signature, "0" * 64))
    assert main(["audit", "verify", "--checkpoint", str(saved)]) == 1
    assert "signature" in capsys.readouterr().out


def test_erase_makes_the_subjects_text_unreadable(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = AuditLog(open_database(Settings(data_dir=data_dir)))
    for user in ("dana", "eli"):
        log.record(
            AuditEntry(
                request_id=f"req_{user}",
                endpoint="/v1/chat/completions",
                tenant="acme",
                end_user=user,
                outcome="ok",
                status_code=200,
                prompt_text=f"secret of {user}",
                store_content=True,
            )
        )
    assert main(["audit", "erase", "--subject", "dana", "--tenant", "acme"]) == 0
    assert "erased 1 key(s) of subject 'dana' in tenant acme" in capsys.readouterr().out
    assert main(["audit", "query", "--tenant", "acme"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["event"], r["prompt_text"]) for r in rows] == [
        ("chat.completion", "[erased]"),
        ("chat.completion", "secret of eli"),
        ("audit.erasure", None),
    ]
    assert main(["audit", "verify"]) == 0


def test_purge_defaults_to_the_longest_policy_retention(
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "a.yaml").write_text("name: a\naudit:\n  retention_days: 30\n")
    (policies / "b.yaml").write_text("name: b\naudit:\n  retention_days: 400\n")
    monkeypatch.setenv("BASTION_POLICY_DIR", str(policies))
    log = AuditLog(open_database(Settings(data_dir=data_dir)))
    log.record(AuditEntry(request_id="r", endpoint="/x", outcome="ok", status_code=200))
    assert main(["audit", "purge"]) == 0
    err = capsys.readouterr().err
    assert "nothing to purge" in err
    cutoff = datetime.fromisoformat(err.rsplit("older than ", 1)[1].strip())
    assert 399 <= (datetime.now(UTC) - cutoff).days <= 400
