"""The OpenAI-compatible embeddings API: `/v1/embeddings` over the MiniLM embedder."""
