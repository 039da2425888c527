"""The database: every table, the connection, and the Alembic migrations."""
