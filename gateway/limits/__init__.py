"""Rate limits and token quotas, per key and per policy, in memory or in Redis."""
