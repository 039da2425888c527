"""`bastion ingest` adds files or folders to a tenant's collection; `bastion reindex`
rebuilds collections' vector indexes from the database (after a crash or a lost file)."""

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
    reindex = commands.add_parser(
        "reindex", help="rebuild vector indexes from the database (all collections by default)"
    )
    reindex.add_argument("--tenant", help="only this tenant's collections")
    reindex.add_argument("--collection", help="only collections of this name")
    add_data_dir(reindex)
    reindex.set_defaults(run=run_reindex)


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


def run_reindex(settings: Settings, args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from gateway.services import open_database
    from retrieval import DocumentStore, Embedder
    from retrieval.models import Document

    sessions = open_database(settings)
    query = select(Document.tenant, Document.collection).distinct()
    if args.tenant:
        query = query.where(Document.tenant == args.tenant)
    if args.collection:
        query = query.where(Document.collection == args.collection)
    with sessions() as session:
        pairs = sorted((row[0], row[1]) for row in session.execute(query))
    if not pairs:
        print("no matching collections")
        return 1
    store = DocumentStore(sessions, Embedder.load(), settings.index_dir)
    for tenant, collection in pairs:
        vectors = store.rebuild_index(tenant, collection)
        print(f"{tenant}/{collection}: {vectors} vectors")
    return 0
