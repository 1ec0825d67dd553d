"""Exponential backoff, the one policy every retry loop of the project uses (pure: it computes
delays, the caller sleeps).

Delays start at `initial_s` and double up to `maximum_s`; `reset()` starts again. Jitter is off
by default on purpose: reconnect delays must be predictable in tests and in the seed's terms
("reconnect_interval_ms doubling up to max(reconnect_interval_ms, 60 s)"). A caller whose many
replicas would otherwise retry in step passes `jitter` (a fraction of the delay, drawn from
`random`, which tests replace with a seeded source).
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

SSE_MAX_S = 60.0  # the seed's cap of the SSE source's reconnect delay


class Backoff:
    __slots__ = ("_next", "_random", "initial", "jitter", "maximum")

    def __init__(
        self,
        initial_s: float,
        maximum_s: float,
        *,
        jitter: float = 0.0,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if initial_s <= 0:
            raise ValueError("initial backoff must be positive")
        if not 0.0 <= jitter <= 1.0:
            raise ValueError("jitter is a fraction of the delay, from 0 to 1")
        self.initial = initial_s
        self.maximum = max(initial_s, maximum_s)
        self.jitter = jitter
        self._next = initial_s
        self._random = random

    def next(self) -> float:
        """The delay to wait now; the one after it doubles, up to the maximum. With jitter, the
        delay is shortened by up to `jitter` of itself."""
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        if self.jitter:
            delay -= delay * self.jitter * self._random()
        return delay

    def reset(self) -> None:
        self._next = self.initial

    @classmethod
    def for_sse_source(cls, reconnect_interval_ms: int) -> Backoff:
        """The seed's SSE rule: from reconnect_interval_ms up to max(that, 60 s)."""
        initial = reconnect_interval_ms / 1000
        return cls(initial, max(initial, SSE_MAX_S))
