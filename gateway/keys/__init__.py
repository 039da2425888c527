"""API keys: the store (only hashes), the admin routes, and the first start's default key."""
