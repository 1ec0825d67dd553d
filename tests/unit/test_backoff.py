"""continuum_common.backoff: the one exponential backoff (its seed SSE rule is tested with the
indexer units)."""

from __future__ import annotations

import pytest

from continuum_common.backoff import Backoff


def test_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(0.25, 1.0)
    assert [b.next() for _ in range(5)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.25
    assert Backoff(2.0, 1.0).maximum == 2.0  # a cap below the start is the start


def test_jitter_shortens_by_at_most_its_share() -> None:
    draws = iter([0.0, 1.0, 0.5])
    b = Backoff(1.0, 8.0, jitter=0.5, random=lambda: next(draws))
    assert [b.next(), b.next(), b.next()] == [1.0, 1.0, 3.0]  # 1, 2 - 50%, 4 - 25%
    with pytest.raises(ValueError):
        Backoff(1.0, 2.0, jitter=1.5)
    with pytest.raises(ValueError):
        Backoff(0.0, 2.0)
