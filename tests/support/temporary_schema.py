"""A throwaway schema in a real PostgreSQL database, for tests and benchmarks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError


@contextmanager
def temporary_schema(server_url: str, prefix: str) -> Iterator[str | None]:
    """Create a fresh schema `<prefix>_<random>` in the database at `server_url` and yield a
    URL whose connections use it; drop it afterwards. Yields None when no server answers."""
    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server_url)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError:
        admin.dispose()
        yield None
        return
    try:
        yield f"{server_url}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
