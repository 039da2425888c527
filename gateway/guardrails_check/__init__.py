"""`POST /v1/guardrails/check` and `bastion guardrails check`: a policy's checks on a text."""
