"""Shared fixtures: the real chat model, loaded once per test session, and a fresh schema
in the real PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from engine import PagedEngine, TransformersEngine, default_model_source
from engine.model_source import load_pretrained
from tests.log_scan import LogScanner
from tests.support.temporary_schema import temporary_schema

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def smollm2() -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (transformers model, fp32, CPU) and its tokenizer."""
    return load_pretrained(default_model_source(), torch.float32)


@pytest.fixture(scope="session")
def chat_engine(smollm2: tuple[Any, Any]) -> Iterator[PagedEngine]:
    """The paged engine on SmolLM2-135M-Instruct, on CPU: what the gateway runs."""
    model, tokenizer = smollm2
    source = default_model_source()
    engine = PagedEngine.from_hf_model(model, tokenizer, source.model_id, device="cpu")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_chat_engine(smollm2: tuple[Any, Any]) -> Iterator[TransformersEngine]:
    """The plain transformers engine on the same weights (the reference implementation)."""
    model, tokenizer = smollm2
    engine = TransformersEngine(
        model, tokenizer, default_model_source().model_id, torch.device("cpu")
    )
    yield engine
    engine.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh schema in the `test` database, dropped afterwards; skipped without a server."""
    with temporary_schema(POSTGRES_URL, "bastion_test") as url:
        if url is None:
            pytest.skip("no PostgreSQL server answers on 127.0.0.1:5432")
        yield url


def pytest_configure(config: pytest.Config) -> None:
    """Scan every test's captured logs for PII and API keys (tests/log_scan.py)."""
    config.pluginmanager.register(LogScanner(), "bastion-log-scan")
