from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retrieval import VectorIndex


def _unit(rows: list[list[float]]) -> np.ndarray:
    array = np.array(rows, dtype=np.float32)
    return array / np.linalg.norm(array, axis=1, keepdims=True)


def test_add_search_remove_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "t" / "c.faiss"
    index = VectorIndex.open(path, dim=3)
    assert index.size == 0
    assert index.search(np.ones(3, dtype=np.float32), 5) == []

    index.add(np.array([10, 20, 30], dtype=np.int64), _unit([[1, 0, 0], [0, 1, 0], [1, 1, 0]]))
    hits = index.search(_unit([[1, 0.1, 0]])[0], 2)
    assert [hit_id for hit_id, _ in hits] == [10, 30]
    assert hits[0][1] > hits[1][1]

    assert index.remove(np.array([10, 99], dtype=np.int64)) == 1
    assert index.size == 2
    index.save()
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.faiss"]

    reopened = VectorIndex.open(path, dim=3)
    assert reopened.size == 2
    assert [hit_id for hit_id, _ in reopened.search(_unit([[1, 0, 0]])[0], 5)] == [30, 20]


def test_adding_an_existing_id_replaces_it(tmp_path: Path) -> None:
    index = VectorIndex.open(tmp_path / "c.faiss", dim=2)
    index.add(np.array([1], dtype=np.int64), _unit([[1, 0]]))
    index.add(np.array([1], dtype=np.int64), _unit([[0, 1]]))
    assert index.size == 1
    assert index.search(_unit([[0, 1]])[0], 1)[0][1] == pytest.approx(1.0)


def test_dimension_mismatch_is_rejected(tmp_path: Path) -> None:
    index = VectorIndex.open(tmp_path / "c.faiss", dim=2)
    with pytest.raises(ValueError, match="shape"):
        index.add(np.array([1], dtype=np.int64), _unit([[1, 0, 0]]))
    index.add(np.array([1], dtype=np.int64), _unit([[1, 0]]))
    index.save()
    with pytest.raises(ValueError, match="2-dimensional"):
        VectorIndex.open(tmp_path / "c.faiss", dim=3)


def test_index_saved_by_another_process_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "c.faiss"
    ours = VectorIndex.open(path, 4)
    ours.add(np.array([1]), np.eye(4, dtype=np.float32)[:1])
    ours.save()
    assert not ours.changed_on_disk
    theirs = VectorIndex.open(path, 4)
    theirs.add(np.array([2]), np.eye(4, dtype=np.float32)[1:2])
    theirs.save()
    assert ours.changed_on_disk
