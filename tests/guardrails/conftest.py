from __future__ import annotations

import pytest
from presidio_analyzer import AnalyzerEngine

from guardrails.config import PiiConfig
from guardrails.pii import PiiRedactor, build_analyzer
from guardrails.topics import Embedder
from retrieval.embedder import Embedder as MiniLM


@pytest.fixture(scope="session")
def analyzer() -> AnalyzerEngine:
    return build_analyzer()


@pytest.fixture(scope="session")
def redactor(analyzer: AnalyzerEngine) -> PiiRedactor:
    return PiiRedactor(analyzer, PiiConfig())


@pytest.fixture(scope="session")
def minilm() -> MiniLM:
    """The float32 MiniLM, as retrieval uses it."""
    return MiniLM.load()


@pytest.fixture(scope="session")
def embedder(minilm: MiniLM) -> Embedder:
    """What the gateway gives the guardrails: MiniLM in bf16 where the CPU has it."""
    return minilm.for_requests()
