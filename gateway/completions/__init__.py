"""OpenAI's legacy text completions: `/v1/completions`."""
