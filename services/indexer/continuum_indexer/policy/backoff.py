"""Exponential backoff with full jitter disabled on purpose: reconnect delays must be
predictable in tests and in the seed's terms ("reconnect_interval_ms doubling up to
max(reconnect_interval_ms, 60 s)")."""

from __future__ import annotations


class Backoff:
    def __init__(self, initial_s: float, maximum_s: float) -> None:
        if initial_s <= 0:
            raise ValueError("initial backoff must be positive")
        self.initial = initial_s
        self.maximum = max(initial_s, maximum_s)
        self._next = initial_s

    def next(self) -> float:
        """The delay to wait now; the one after it doubles, up to the maximum."""
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.initial

    @classmethod
    def for_sse_source(cls, reconnect_interval_ms: int) -> Backoff:
        """The seed's SSE rule: from reconnect_interval_ms up to max(that, 60 s)."""
        initial = reconnect_interval_ms / 1000
        return cls(initial, max(initial, 60.0))
