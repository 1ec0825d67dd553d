"""Resync requests: a KV index consumer asks a backend's listener to restate what the engine
holds (core NATS, subject `continuum.kv.resync.<backend>`; the listener that owns the backend
subscribes to its own subjects only, so NATS permissions can stay per listener).

Sent when a consumer finds it lacks a backend's history (the index started the backend's state
from a batch that does not begin an epoch: its store lost its data, keys expired while the
engine was idle, or it joined after the epoch began). The listener answers with a new epoch
(`AllCleared`, then every block its events left resident), rate-limited on both sides.
msgpack via msgspec, a tagged array:

    [backend, reason, requester]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Annotated, Final

import msgspec

from continuum_common.errors import ContinuumError
from continuum_common.wire.codec import StructCodec

SUBJECT_PREFIX: Final = "continuum.kv.resync."
SUBJECT_WILDCARD: Final = "continuum.kv.resync.*"

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


def subject_for(backend: str) -> str:
    return SUBJECT_PREFIX + backend


class ResyncRequestDecodeError(ContinuumError, ValueError):
    """A resync request that cannot be used (counted and dropped)."""


class ResyncRequest(msgspec.Struct, array_like=True, frozen=True):
    backend: _Name
    reason: Annotated[str, msgspec.Meta(max_length=64)] = "index_gap"
    requester: Annotated[str, msgspec.Meta(max_length=256)] = ""


_codec = StructCodec(ResyncRequest, ResyncRequestDecodeError, "resync request")
encode_resync_request = _codec.encode
decode_resync_request = _codec.decode


class ResyncThrottle:
    """At most one resync per `interval` per backend, on each side: a consumer that lost a
    backend's history reports a gap for every batch until the restatement lands, and a listener
    must not restate again for every copy of the request."""

    def __init__(self, interval: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}

    def due(self, backends: Iterable[str]) -> tuple[list[str], list[str]]:
        """(backends to ask now, backends asked too recently); records the asks."""
        now = self._clock()
        ask: list[str] = []
        wait: list[str] = []
        for backend in sorted(set(backends)):
            last = self._last.get(backend)
            if last is not None and now - last < self.interval:
                wait.append(backend)
            else:
                self._last[backend] = now
                ask.append(backend)
        if len(self._last) > 4096:  # forget the oldest asks: bounded, whatever the backend names
            for name, _ in sorted(self._last.items(), key=lambda kv: kv[1])[:2048]:
                del self._last[name]
        return ask, wait
