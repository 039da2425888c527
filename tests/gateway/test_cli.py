"""The `bastion` CLI on a data folder: keys, ingest, db, audit; all through `main()`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.audit.chain import verify_chain
from gateway.cli import main
from gateway.keys.store import authenticate
from gateway.services import open_database
from gateway.settings import Settings
from retrieval import DocumentStore, Embedder


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("BASTION_DATA_DIR", str(folder))
    return folder


def test_db_upgrade_creates_the_database(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade"]) == 0
    assert (data_dir / "bastion.db").is_file()
    assert "database at head" in capsys.readouterr().out


def test_keys_create_prints_a_working_key_once_and_audits_it(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "--tenant", "acme", "--role", "admin"]) == 0
    secret = capsys.readouterr().out.strip()
    sessions = open_database(Settings(data_dir=data_dir))
    identity = authenticate(sessions, secret)
    assert identity is not None and (identity.tenant, identity.role) == ("acme", "admin")
    assert main(["keys", "list"]) == 0
    listing = capsys.readouterr().out
    assert identity.key_id in listing and secret not in listing
    assert main(["keys", "rotate", identity.key_id]) == 0
    rotated = capsys.readouterr().out.strip()
    assert authenticate(sessions, secret) is None and authenticate(sessions, rotated)
    secret = rotated
    identity = authenticate(sessions, rotated)
    assert identity is not None
    assert main(["keys", "revoke", identity.key_id]) == 0
    assert capsys.readouterr().out.startswith(f"revoked {identity.key_id}")
    assert authenticate(sessions, secret) is None
    assert main(["audit", "query", "--event", "admin.key_created"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 1
    assert verify_chain(sessions).records == 3  # created, rotated, revoked


def test_keys_create_rejects_an_unknown_role(data_dir: Path) -> None:
    with pytest.raises(SystemExit):
        main(["keys", "create", "--tenant", "acme", "--role", "root"])


def ingest_handbook(tmp_path: Path) -> None:
    """Ingest two small documents into tenant acme's "handbook" collection."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "parking.md").write_text("# Parking\nVisitors park in the north garage, level 2.\n")
    (docs / "lunch.txt").write_text("The canteen serves lunch from 11:30 to 14:00.\n")
    assert main(["ingest", str(docs), "--collection", "handbook", "--tenant", "acme"]) == 0


def test_ingest_adds_searchable_documents(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ingest_handbook(tmp_path)
    assert "2 documents: 2 created" in capsys.readouterr().out
    settings = Settings(data_dir=data_dir)
    store = DocumentStore(open_database(settings), Embedder.load(), settings.index_dir)
    found = store.search("acme", ["handbook"], "where can guests leave their car?", top_k=1)
    assert found and found[0].source.endswith("parking.md")


def test_reindex_rebuilds_lost_vector_files_from_the_database(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ingest_handbook(tmp_path)
    settings = Settings(data_dir=data_dir)
    lost = [p for p in settings.index_dir.rglob("*") if p.is_file()]
    assert lost
    for path in lost:
        path.unlink()
    question = "where can guests leave their car?"
    store = DocumentStore(open_database(settings), Embedder.load(), settings.index_dir)
    # Until reindexed, dense search builds the lost index in memory, writing no file.
    found = store.search("acme", ["handbook"], question, top_k=1, mode="dense")
    assert found and found[0].source.endswith("parking.md")
    assert not [p for p in settings.index_dir.rglob("*") if p.is_file()]
    capsys.readouterr()

    assert main(["reindex", "--tenant", "acme"]) == 0
    assert "acme/handbook: 2 vectors" in capsys.readouterr().out
    store = DocumentStore(open_database(settings), Embedder.load(), settings.index_dir)
    found = store.search("acme", ["handbook"], question, top_k=1, mode="dense")
    assert found and found[0].source.endswith("parking.md")
    assert main(["reindex", "--tenant", "nobody"]) == 1


def test_audit_verify_and_checkpoint(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["keys", "create", "--tenant", "acme", "--role", "user"])
    capsys.readouterr()
    assert main(["audit", "checkpoint"]) == 0
    checkpoint = tmp_path / "checkpoint.json"
    checkpoint.write_text(capsys.readouterr().out)
    assert json.loads(checkpoint.read_text())["seq"] == 1
    assert main(["audit", "verify", "--checkpoint", str(checkpoint)]) == 0
    assert capsys.readouterr().out.startswith("OK: 1 records")
    assert main(["audit", "export", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("id,seq,prev_hash")


def test_keys_create_with_expiry_and_limits(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "keys",
        "create",
        "--tenant",
        "acme",
        "--role",
        "user",
        "--expires-in-days",
        "7",
        "--requests-per-minute",
        "12",
    ]
    assert main(args) == 0
    secret = capsys.readouterr().out.strip()
    identity = authenticate(open_database(Settings(data_dir=data_dir)), secret)
    assert identity is not None and identity.requests_per_minute == 12
    bad = ["keys", "create", "--tenant", "acme", "--role", "user", "--requests-per-minute", "0"]
    assert main(bad) == 2
