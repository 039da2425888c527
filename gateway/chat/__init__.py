"""The OpenAI-compatible chat API: `/v1/chat/completions` and `/v1/models`."""
