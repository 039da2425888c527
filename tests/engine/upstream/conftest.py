"""One real llama-server for the upstream tests, and configs that point at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from engine import (
    ChatMessage,
    GenerationRequest,
    SamplingParams,
    TokenDelta,
    UpstreamConfig,
    UpstreamEngine,
    UpstreamTimeouts,
)
from tests.support.llama_server import MODEL_ALIAS, LlamaServer, running_llama_server

QUESTION = (ChatMessage("user", "Name three colours."),)
# A port of 127.0.0.1 where nothing listens: connecting is refused at once.
REFUSED_URL = "http://127.0.0.1:9/v1"
FAST = UpstreamTimeouts(connect=1.0, first_token=10.0, idle=5.0, total=30.0)


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    with running_llama_server() as server:
        yield server


def upstream_config(*base_urls: str, **options: Any) -> UpstreamConfig:
    options.setdefault("timeouts", FAST)
    options.setdefault("tokenizer", "estimate")
    return UpstreamConfig("smol", tuple(base_urls), MODEL_ALIAS, **options)


def ask(max_tokens: int = 8, **sampling: Any) -> GenerationRequest:
    return GenerationRequest("r", QUESTION, SamplingParams(max_tokens=max_tokens, **sampling))


async def collect(engine: UpstreamEngine, request: GenerationRequest) -> list[TokenDelta]:
    return [delta async for delta in engine.stream(request)]


@asynccontextmanager
async def open_engine(config: UpstreamConfig) -> AsyncIterator[UpstreamEngine]:
    engine = UpstreamEngine(config)
    try:
        yield engine
    finally:
        await engine.aclose()
