"""The `bastion` command line: serve, ingest, keys, db."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.log_config import configure_logging
from gateway.settings import Settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging()
    overrides = {
        name: value
        for name in ("data_dir", "host", "port")
        if (value := getattr(args, name, None)) is not None
    }
    settings = Settings(**overrides)
    try:
        return int(args.run(settings, args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bastion", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="address to bind (BASTION_HOST)")
    serve.add_argument("--port", type=int, help="port to bind (BASTION_PORT)")
    serve.add_argument("--data-dir", type=Path, help="data folder (BASTION_DATA_DIR)")
    serve.set_defaults(run=_serve)

    ingest = commands.add_parser("ingest", help="add text and Markdown files to a collection")
    ingest.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    ingest.add_argument("--collection", required=True)
    ingest.add_argument("--tenant", required=True)
    ingest.add_argument("--data-dir", type=Path)
    ingest.set_defaults(run=_ingest)

    keys = commands.add_parser("keys", help="manage API keys")
    key_commands = keys.add_subparsers(required=True, metavar="ACTION")
    create = key_commands.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--role", required=True, choices=["user", "admin", "auditor"])
    create.add_argument("--data-dir", type=Path)
    create.set_defaults(run=_create_key)

    db = commands.add_parser("db", help="manage the database schema")
    db_commands = db.add_subparsers(required=True, metavar="ACTION")
    upgrade = db_commands.add_parser("upgrade", help="apply Alembic migrations")
    upgrade.add_argument("--data-dir", type=Path)
    upgrade.set_defaults(run=_db_upgrade)
    return parser


def _serve(settings: Settings, _: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.bootstrap import ensure_default_key
    from gateway.services import open_database

    sessions = open_database(settings)
    key = ensure_default_key(settings, sessions)
    url = f"http://{settings.host}:{settings.port}"
    print(f"Bastion is starting on {url}  (OpenAI base URL: {url}/v1)", flush=True)
    print(f"API key for tenant '{settings.default_tenant}': {key}", flush=True)
    print(f"Readiness: {url}/readyz turns 200 once the models are loaded.", flush=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_config=None)
    return 0


def _ingest(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.services import open_database
    from retrieval import DocumentStore, Embedder

    sessions = open_database(settings)
    store = DocumentStore(sessions, Embedder.load(), settings.index_dir)
    results = store.ingest_paths(args.paths, tenant=args.tenant, collection=args.collection)
    counts = {
        status: sum(r.status == status for r in results)
        for status in ("created", "updated", "unchanged")
    }
    print(f"{len(results)} documents: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0


def _create_key(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.keys import create_key
    from gateway.services import open_database

    secret, identity = create_key(open_database(settings), args.tenant, args.role)
    print(secret)
    print(
        f"key id {identity.key_id}, tenant {identity.tenant}, role {identity.role}. "
        "This is the only time the key is shown.",
        file=sys.stderr,
    )
    return 0


def _db_upgrade(settings: Settings, _: argparse.Namespace) -> int:
    from gateway.migrations import upgrade_database

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.resolved_database_url)
    print(f"database at head: {settings.resolved_database_url.split('@')[-1]}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
