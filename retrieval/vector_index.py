"""A faiss inner-product index of one (tenant, collection), persisted to one file."""

from __future__ import annotations

import math
import os
from pathlib import Path

import faiss
import numpy as np
import numpy.typing as npt

APPROXIMATE_ABOVE = 50_000
"""Collections with more vectors than this switch from exact search to an IVF index."""


class VectorIndex:
    """Inner-product search over vectors keyed by chunk id.

    Exact (a flat index) up to `approximate_above` vectors; past that the index is retrained
    as an inverted file (IVF) that probes about a tenth of its lists, and stays one.
    Not thread-safe: callers serialise access (DocumentStore holds a lock around it).
    """

    def __init__(
        self,
        path: Path,
        index: faiss.IndexIDMap2 | faiss.IndexIVFFlat,
        dim: int,
        approximate_above: int = APPROXIMATE_ABOVE,
    ) -> None:
        self.path = path
        self.dim = dim
        self.approximate_above = approximate_above
        self._index = index
        self._file_stamp = _stamp(path)
        if isinstance(index, faiss.IndexIVF):
            _prepare_ivf(index)

    @classmethod
    def open(cls, path: Path, dim: int, approximate_above: int = APPROXIMATE_ABOVE) -> VectorIndex:
        """Read the index at `path`, or start an empty one that `save` will create there."""
        if path.exists():
            index = faiss.read_index(str(path))
            if not isinstance(index, faiss.IndexIDMap2 | faiss.IndexIVFFlat):
                raise ValueError(f"{path} is neither an IndexIDMap2 nor an IndexIVFFlat index")
            if index.d != dim:
                raise ValueError(
                    f"index {path} holds {index.d}-dimensional vectors, expected {dim}; "
                    "was it built with another embedding model?"
                )
        else:
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        return cls(path, index, dim, approximate_above)

    @property
    def changed_on_disk(self) -> bool:
        """True when another process (say `bastion ingest`) saved the file since we read it."""
        return _stamp(self.path) != self._file_stamp

    @property
    def size(self) -> int:
        return int(self._index.ntotal)

    @property
    def approximate(self) -> bool:
        return isinstance(self._index, faiss.IndexIVF)

    def ids(self) -> npt.NDArray[np.int64]:
        """The ids of all vectors held, in no particular order."""
        if isinstance(self._index, faiss.IndexIDMap2):
            return faiss.vector_to_array(self._index.id_map).astype(np.int64)
        lists = self._index.invlists
        if lists is None:
            return np.zeros(0, np.int64)
        parts = [
            faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy()
            for i in range(lists.nlist)
            if lists.list_size(i)
        ]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def add(self, ids: npt.NDArray[np.int64], vectors: npt.NDArray[np.float32]) -> None:
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
        if not self.approximate and self.size > self.approximate_above:
            self._switch_to_ivf()

    def remove(self, ids: npt.NDArray[np.int64]) -> int:
        """Remove the vectors with these ids; returns how many were present."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) == 0 or self.size == 0:
            return 0
        # faiss wraps remove_ids to take an id array, but its stubs only know IDSelector.
        return int(self._index.remove_ids(ids))  # type: ignore[arg-type]

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[tuple[int, float]]:
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

    def _switch_to_ivf(self) -> None:
        if not isinstance(self._index, faiss.IndexIDMap2):
            return
        ids = self.ids()
        vectors = np.asarray(self._index.index.reconstruct_n(0, self.size), dtype=np.float32)
        nlist = min(4096, max(16, int(4 * math.sqrt(len(ids)))))
        quantizer = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.train(vectors)
        _prepare_ivf(ivf)
        ivf.add_with_ids(vectors, ids)
        self._index = ivf


def _prepare_ivf(index: faiss.IndexIVF) -> None:
    # A hashtable direct map lets vectors be removed and replaced by id.
    hashtable = faiss.DirectMap.Hashtable  # type: ignore[attr-defined]
    if index.direct_map.type != hashtable:
        index.set_direct_map_type(hashtable)
    index.nprobe = max(8, index.nlist // 10)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_mtime_ns, stat.st_size)
