"""The audit log: entries, the hash chain, sealed text, queries, retention, signed
checkpoints, the auditor routes and the review page."""
