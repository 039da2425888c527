"""`bastion ingest`: add files or folders to a tenant's collection."""

from __future__ import annotations

import argparse
from pathlib import Path

from gateway.commands._common import add_data_dir, record_admin_action
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ingest = commands.add_parser("ingest", help="add documents to a collection")
    ingest.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    ingest.add_argument("--collection", required=True)
    ingest.add_argument("--tenant", required=True)
    add_data_dir(ingest)
    ingest.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.services import open_database
    from retrieval import DocumentStore, Embedder

    sessions = open_database(settings)
    store = DocumentStore(sessions, Embedder.load(), settings.index_dir)
    results = store.ingest_paths(args.paths, tenant=args.tenant, collection=args.collection)
    counts = {
        status: sum(r.status == status for r in results)
        for status in ("created", "updated", "unchanged", "duplicate")
    }
    record_admin_action(
        sessions,
        "admin.documents_ingested",
        args.tenant,
        collection=args.collection,
        documents=[r.document_id for r in results if r.status != "unchanged"],
    )
    print(f"{len(results)} documents: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 0
