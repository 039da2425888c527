"""Helpers tests and benches share: a live server on loopback, a throwaway PostgreSQL schema."""
