"""The semantic vector index: cosine by dot product, partitions, oldest-first, expiry."""

from __future__ import annotations

import numpy as np
import pytest

from continuum_ingress.cache.semantic_index import SemanticIndex, normalize


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_normalize_rejects_degenerate_vectors() -> None:
    assert normalize([]) is None
    assert normalize([0.0, 0.0]) is None
    assert normalize([1.0, float("nan")]) is None
    unit = normalize([3.0, 4.0])
    assert unit is not None and unit.dtype == np.float32 and np.allclose(unit, [0.6, 0.8])


def test_search_scores_by_cosine_inside_the_partition_only() -> None:
    index = SemanticIndex(10)
    assert index.add("p1", "a", [1.0, 0.0, 0.0], ttl=60)
    assert index.add("p1", "b", [0.0, 1.0, 0.0], ttl=60)
    assert index.add("p2", "c", [10.0, 0.1, 0.0], ttl=60)
    match = index.search("p1", [5.0, 0.5, 0.0], threshold=0.9)
    assert match is not None and match.entry_id == "a"
    assert match.score == pytest.approx(5 / np.sqrt(25.25), rel=1e-5)
    assert index.search("p1", [5.0, 0.5, 0.0], threshold=0.999) is None
    assert index.search("p3", [1.0, 0.0, 0.0], threshold=0.0) is None
    match2 = index.search("p2", [1.0, 0.0, 0.0], threshold=0.9)
    assert match2 is not None and match2.entry_id == "c"


def test_oldest_entries_give_way_first() -> None:
    index = SemanticIndex(3)
    for i in range(5):
        vec = np.zeros(8)
        vec[i] = 1.0
        index.add("p", f"e{i}", vec, ttl=60)
    assert len(index) == 3
    for gone in (0, 1):
        vec = np.zeros(8)
        vec[gone] = 1.0
        assert index.search("p", vec, 0.5) is None
    vec = np.zeros(8)
    vec[4] = 1.0
    found = index.search("p", vec, 0.5)
    assert found is not None and found.entry_id == "e4"


def test_same_id_replaces_its_row() -> None:
    index = SemanticIndex(4)
    index.add("p", "x", [1.0, 0.0], ttl=60)
    index.add("p", "x", [0.0, 1.0], ttl=60)
    assert len(index) == 1
    assert index.search("p", [1.0, 0.0], 0.5) is None
    assert index.search("p", [0.0, 1.0], 0.5) is not None


def test_expired_entries_are_skipped_and_freed() -> None:
    clock = Clock()
    index = SemanticIndex(4, clock=clock)
    index.add("p", "old", [1.0, 0.0], ttl=10)
    clock.now = 5
    index.add("p", "new", [0.9, 0.1], ttl=10)
    clock.now = 11
    match = index.search("p", [1.0, 0.0], 0.5)
    assert match is not None and match.entry_id == "new" and len(index) == 1
    clock.now = 100
    assert index.search("p", [1.0, 0.0], 0.0) is None and len(index) == 0 and index.partitions == 0


def test_new_dimension_resets_and_resize_keeps_newest() -> None:
    index = SemanticIndex(4)
    index.add("p", "a", [1.0, 0.0], ttl=60)
    index.add("p", "b3", [1.0, 0.0, 0.0], ttl=60)  # the embedding model changed
    assert len(index) == 1 and index.dim == 3
    for i in range(4):
        index.add("p", f"n{i}", [1.0, float(i), 0.0], ttl=60)
    index.resize(2)
    assert len(index) == 2
    match = index.search("p", [1.0, 3.0, 0.0], 0.99)
    assert match is not None and match.entry_id == "n3"
    index.remove("p", "n3")
    assert len(index) == 1
    assert index.clear() == 1 and len(index) == 0


def test_unusable_query_or_entry() -> None:
    index = SemanticIndex(2)
    assert not index.add("p", "zero", [0.0, 0.0], ttl=60)
    index.add("p", "a", [1.0, 0.0], ttl=60)
    assert index.search("p", [1.0, 0.0, 0.0], 0.0) is None  # wrong dimension
    assert index.search("p", [0.0, 0.0], 0.0) is None
