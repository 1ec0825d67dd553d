"""A message delivered both live and by the route history's replay is handed on once, whichever
copy comes first (kv/replay_overlap.py)."""

from __future__ import annotations

from continuum_ingress.kv.replay_overlap import ReplayOverlap

S = "continuum.kv.decisions.r2"


def m(i: int) -> bytes:
    return f"decision {i}".encode()


def test_without_a_replay_everything_live_is_handed_on() -> None:
    o = ReplayOverlap()
    assert all(o.live(S, m(1)) for _ in range(3))  # no replay: nothing to tell apart, no memory
    assert o.skipped == 0


def test_live_first_then_replayed() -> None:
    o = ReplayOverlap()
    o.start()
    for i in range(5):  # the history before the subscription
        assert o.replayed(S, m(i))
    assert o.live(S, m(5)) and o.live(S, m(6))  # published after the subscription...
    assert not o.replayed(S, m(5)) and not o.replayed(S, m(6))  # ...and stored before the replay's end
    o.done()
    assert o.live(S, m(7))
    assert o.skipped == 2


def test_replayed_first_then_live() -> None:
    o = ReplayOverlap()
    o.start()
    for i in range(3):
        assert o.replayed(S, m(i))
    o.done()  # the live callbacks of the last two ran after the replay
    assert not o.live(S, m(1)) and not o.live(S, m(2))
    assert o.live(S, m(3))
    # past the overlap: an old message published again (it cannot be, but) is not held back
    assert o.live(S, m(0))
    assert o.skipped == 2


def test_the_same_bytes_on_another_subject_are_another_message() -> None:
    o = ReplayOverlap()
    o.start()
    assert o.live(S, m(1))
    assert o.replayed("continuum.kv.tokenized.r2", m(1))
    assert not o.replayed(S, m(1))


def test_both_windows_are_bounded() -> None:
    o = ReplayOverlap(window=4)
    o.start()
    for i in range(10):
        assert o.live(S, m(i))
    assert not o.replayed(S, m(0))  # the first ones delivered live are remembered...
    assert o.replayed(S, m(9))  # ...not the ones past the window
    for i in range(100, 110):
        assert o.replayed(S, m(i))
    o.done()
    assert o.live(S, m(101))  # past the replayed window: handed on (and the overlap is over)
    assert o.live(S, m(109))
