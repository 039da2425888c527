"""`BASTION_SQLITE_SYNCHRONOUS`: how SQLite commits (under WAL, `normal` skips the fsync
each audit record's commit would otherwise wait for; `full` keeps it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from gateway.services import open_database
from gateway.settings import Settings

# SQLite's numbers for the setting (PRAGMA synchronous reads them back).
_READ_BACK = {"normal": 1, "full": 2}


@pytest.mark.parametrize("choice", ["normal", "full"])
def test_the_setting_reaches_every_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, choice: str
) -> None:
    monkeypatch.setenv("BASTION_SQLITE_SYNCHRONOUS", choice)
    sessions = open_database(Settings(data_dir=tmp_path))
    with sessions() as session:
        assert session.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert session.execute(text("PRAGMA synchronous")).scalar() == _READ_BACK[choice]


def test_normal_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BASTION_SQLITE_SYNCHRONOUS", raising=False)
    sessions = open_database(Settings(data_dir=tmp_path))
    with sessions() as session:
        assert session.execute(text("PRAGMA synchronous")).scalar() == _READ_BACK["normal"]


def test_an_unknown_choice_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASTION_SQLITE_SYNCHRONOUS", "off")
    with pytest.raises(ValidationError, match="sqlite_synchronous"):
        Settings()
