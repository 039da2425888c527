"""`bastion db upgrade`: bring the schema to the newest Alembic revision."""

from __future__ import annotations

import argparse

from gateway.commands._common import add_data_dir
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = commands.add_parser("db", help="manage the database schema")
    actions = db.add_subparsers(required=True, metavar="ACTION")
    upgrade = actions.add_parser("upgrade", help="apply Alembic migrations")
    add_data_dir(upgrade)
    upgrade.set_defaults(run=run_upgrade)


def run_upgrade(settings: Settings, _: argparse.Namespace) -> int:
    from gateway.db.migrations import upgrade_database

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.resolved_database_url)
    print(f"database at head: {settings.resolved_database_url.split('@')[-1]}")
    return 0
