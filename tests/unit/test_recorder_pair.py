"""One answer fed to two recorders: the response cache's and the KV scorer's (hooks.py)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest

from continuum_ingress.hooks import ANSWER_RECORDER, RecorderPair, answer_recorders
from continuum_ingress.state import RequestState


class Tape:
    def __init__(self, fail: bool = False) -> None:
        self.fed: list[bytes] = []
        self.committed: list[int] = []
        self.aborted = 0
        self.abandoned: list[int] = []
        self.fail = fail

    def feed(self, chunk: bytes) -> None:
        self.fed.append(chunk)

    async def commit(self, status: int, headers: Sequence[tuple[str, str]]) -> object:
        self.committed.append(status)
        if self.fail:
            raise RuntimeError("store down")
        return "stored"

    def abort(self) -> None:
        self.aborted += 1
        if self.fail:
            raise RuntimeError("boom")

    def abandon(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        self.abandoned.append(status)
        if self.fail:
            raise RuntimeError("boom")


def state(**extras: Any) -> RequestState:
    return cast(RequestState, SimpleNamespace(extras=extras))


async def test_both_recorders_get_every_chunk_and_the_commit() -> None:
    cache, answer = Tape(), Tape()
    pair = RecorderPair(cache, answer)
    pair.feed(b"a")
    pair.feed(b"b")
    assert await pair.commit(200, []) == "stored"
    assert cache.fed == answer.fed == [b"a", b"b"]
    assert cache.committed == answer.committed == [200]


async def test_a_failing_first_recorder_does_not_starve_the_second() -> None:
    cache, answer = Tape(fail=True), Tape()
    pair = RecorderPair(cache, answer)
    with pytest.raises(RuntimeError):
        await pair.commit(200, [])
    assert answer.committed == [200]
    with pytest.raises(RuntimeError):
        pair.abort()
    assert answer.aborted == 1
    with pytest.raises(RuntimeError):
        pair.abandon(200, [])
    assert cache.abandoned == answer.abandoned == [200]


def test_the_answer_recorder_joins_the_cache_recorder_only_when_set() -> None:
    cache, answer = Tape(), Tape()
    assert answer_recorders(state(), cache) is cache
    assert answer_recorders(state(), None) is None
    assert answer_recorders(state(**{ANSWER_RECORDER: answer}), None) is answer
    pair = answer_recorders(state(**{ANSWER_RECORDER: answer}), cache)
    assert isinstance(pair, RecorderPair) and pair.first is cache and pair.second is answer
