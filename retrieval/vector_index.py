"""A faiss inner-product index of one (tenant, collection), persisted to one file."""

from __future__ import annotations

import os
from pathlib import Path

import faiss
import numpy as np


class VectorIndex:
    """Exact inner-product search over vectors keyed by chunk id.

    Not thread-safe: callers serialise access (DocumentStore holds a lock around it).
    """

    def __init__(self, path: Path, index: faiss.IndexIDMap2, dim: int) -> None:
        self.path = path
        self.dim = dim
        self._index = index
        self._file_stamp = _stamp(path)

    @classmethod
    def open(cls, path: Path, dim: int) -> VectorIndex:
        """Read the index at `path`, or start an empty one that `save` will create there."""
        if path.exists():
            index = faiss.read_index(str(path))
            if not isinstance(index, faiss.IndexIDMap2):
                raise ValueError(f"{path} is not an IndexIDMap2 index")
            if index.d != dim:
                raise ValueError(
                    f"index {path} holds {index.d}-dimensional vectors, expected {dim}; "
                    "was it built with another embedding model?"
                )
        else:
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        return cls(path, index, dim)

    @property
    def changed_on_disk(self) -> bool:
        """True when another process (say `bastion ingest`) saved the file since we read it."""
        return _stamp(self.path) != self._file_stamp

    @property
    def size(self) -> int:
        return int(self._index.ntotal)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add `vectors` under `ids`; an id already present is replaced, never duplicated."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {vectors.shape}")
        if len(ids) != len(vectors):
            raise ValueError(f"got {len(ids)} ids for {len(vectors)} vectors")
        if len(ids) == 0:
            return
        self.remove(ids)
        self._index.add_with_ids(vectors, ids)

    def remove(self, ids: np.ndarray) -> int:
        """Remove the vectors with these ids; returns how many were present."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) == 0 or self.size == 0:
            return 0
        # faiss wraps remove_ids to take an id array, but its stubs only know IDSelector.
        return int(self._index.remove_ids(ids))  # type: ignore[arg-type]

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The ids and inner-product scores of the `k` nearest vectors, best first."""
        if k <= 0 or self.size == 0:
            return []
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self.dim)
        scores, ids = self._index.search(query, min(k, self.size))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if int(i) != -1]

    def save(self) -> None:
        """Write atomically: a temp file then `os.replace`, so a crash leaves the old file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        try:
            faiss.write_index(self._index, str(tmp))
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
            self._file_stamp = _stamp(self.path)
        finally:
            tmp.unlink(missing_ok=True)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_mtime_ns, stat.st_size)
