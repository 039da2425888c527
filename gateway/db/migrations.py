"""Running the Alembic migrations in `migrations/` against a database URL."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from gateway.settings import REPO_ROOT

MIGRATIONS_DIR = REPO_ROOT / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade_database(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)
