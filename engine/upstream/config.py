"""What the gateway tells an upstream engine: where its servers are and how to treat them.

The models file (`BASTION_MODELS_FILE`, validated in `gateway/models/`) is parsed into these;
the upstream engine reads nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TokenizerKind = Literal["upstream", "local", "estimate"]


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Seconds. `first_token` bounds the wait for the first streamed token (a hung
    upstream); `idle` the gap between two chunks; `total` the whole answer."""

    connect: float = 5.0
    first_token: float = 60.0
    idle: float = 30.0
    total: float = 600.0


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """One model served by one or more OpenAI-compatible servers.

    `base_urls` end in `/v1` (as clients configure them); a request goes to the first
    healthy one and fails over to the next. `api_key_env` names the environment variable
    that holds the bearer key; the key itself is read at start and never logged.
    `context_window` of None asks the upstream (`/v1/models`, llama.cpp's `/props`).
    `tokenizer`: "upstream" counts with the server's `/tokenize`, "local" with the
    tokenizer folder `tokenizer_path`, "estimate" with a documented bound.
    """

    model_id: str
    base_urls: tuple[str, ...]
    upstream_model: str
    api_key_env: str | None = None
    timeouts: UpstreamTimeouts = UpstreamTimeouts()
    max_concurrency: int = 64
    context_window: int | None = None
    tokenizer: TokenizerKind = "upstream"
    tokenizer_path: Path | None = None
    forward_cache_salt: bool = False
    max_retries: int = 2
    circuit_failures: int = 5
    circuit_reset_s: float = 30.0
    health_interval_s: float = 10.0
