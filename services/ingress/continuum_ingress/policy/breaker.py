"""A per-backend circuit breaker (passive failure detection).

closed --(N consecutive failures)--> open --(cool-down elapsed)--> half-open (one trial request)
half-open --success--> closed;  half-open --failure--> open with the cool-down doubled (capped).

Failures are connect errors, timeouts and 5xx answers; a 4xx is the client's fault and counts
as a success for the backend. Time is passed in, so the machine is testable without sleeping.
"""

from __future__ import annotations

from enum import IntEnum


class BreakerState(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    __slots__ = (
        "_failures",
        "_open_for",
        "_retry_at",
        "_trial",
        "max_open_seconds",
        "open_seconds",
        "state",
        "threshold",
    )

    def __init__(self, threshold: int = 3, open_seconds: float = 5.0, max_open_seconds: float = 60.0) -> None:
        self.threshold = threshold
        self.open_seconds = open_seconds
        self.max_open_seconds = max_open_seconds
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._open_for = open_seconds
        self._retry_at = 0.0
        self._trial = False

    def available(self, now: float) -> bool:
        """May a new request be sent? (No state change: selection may not pick this backend.)"""
        if self.state is BreakerState.CLOSED:
            return True
        return now >= self._retry_at and not self._trial

    def on_start(self, now: float) -> None:
        """A request is being sent: past the cool-down it becomes the half-open trial."""
        if self.state is not BreakerState.CLOSED and now >= self._retry_at and not self._trial:
            self.state = BreakerState.HALF_OPEN
            self._trial = True

    def on_success(self) -> None:
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._open_for = self.open_seconds
        self._trial = False

    def on_failure(self, now: float) -> None:
        if self.state is BreakerState.CLOSED:
            self._failures += 1
            if self._failures >= self.threshold:
                self._open(now)
            return
        if self.state is BreakerState.HALF_OPEN:
            self._open_for = min(self._open_for * 2, self.max_open_seconds)
        self._open(now)

    def on_abandon(self, now: float) -> None:
        """The request ended without a verdict (client went away): free the trial slot."""
        if self._trial:
            self._trial = False
            self.state = BreakerState.OPEN
            self._retry_at = now

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self._retry_at = now + self._open_for
        self._trial = False
