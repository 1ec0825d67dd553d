"""The simulated engine's per-request stamps: bounded, keyed by the caller's id, cleared on read."""

from __future__ import annotations

import pytest

from continuum_sim.request_times import MAX_ID, TimeLog


def test_only_requests_with_a_usable_id_are_recorded() -> None:
    log = TimeLog()
    assert log.start(None, 1.0) is None
    assert log.start("", 1.0) is None
    assert log.start("x" * (MAX_ID + 1), 1.0) is None
    times = log.start("a", 1.0)
    assert times is not None
    times.arrived = 2.0
    assert log.drain() == {
        "requests": [
            {"id": "a", "head": 1.0, "arrived": 2.0, "submitted": None, "first_chunk": None, "first_content": None}
        ],
        "dropped": 0,
    }
    assert log.drain() == {"requests": [], "dropped": 0}


def test_the_oldest_go_first_and_are_counted() -> None:
    log = TimeLog(capacity=2)
    for n in range(5):
        log.start(f"r{n}", float(n))
    log.start("r3", 9.0)  # a repeated id keeps the latest request, as the newest
    out = log.drain()
    assert [(r["id"], r["head"]) for r in out["requests"]] == [("r4", 4.0), ("r3", 9.0)]
    assert out["dropped"] == 3


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TimeLog(capacity=0)
