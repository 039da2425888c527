"""What every route shares: authentication, errors, body and header limits, request ids,
metrics and the health probes."""
