"""Policies: the YAML schema, the registry that binds them to tenants and hot-reloads them,
the guardrails built from each, policy test cases, and the admin routes."""
