"""Live per-backend state: in-flight count, EWMA latency, sliding-window success rate, active
health verdict and circuit breaker.

State is keyed by backend name and survives hot reloads (a reload that keeps `vllm-1` keeps its
in-flight count, so the CHWBL bound stays right while old requests drain). Pure bookkeeping:
the adapters report outcomes, the pipeline reads it; every mutation happens on the event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from continuum_common.config import Backend
from continuum_ingress.deadline import Deadline
from continuum_ingress.policy.breaker import BreakerState, CircuitBreaker

EWMA_ALPHA = 0.2  # weight of the newest latency sample
SUCCESS_WINDOW = 100  # outcomes kept for the success rate
HEALTH_FAILURES_TO_DOWN = 2  # consecutive failed active checks before a backend is marked down


class BackendState:
    __slots__ = (
        "_window",
        "_window_ok",
        "breaker",
        "first_byte_waits",
        "health_failures",
        "healthy",
        "latency",
        "local_in_flight",
        "local_queued_tokens",
        "name",
        "remote_in_flight",
        "remote_queued_tokens",
        "spec",
        "weight",
    )

    def __init__(self, spec: Backend) -> None:
        self.spec = spec
        self.name = spec.name
        self.weight = spec.weight
        self.local_in_flight = 0
        # Uncached prompt tokens of requests sent here that have not produced a first byte yet
        # (the KV scorer's estimate of the backend's prefill queue; docs/kv-scorer.md).
        self.local_queued_tokens = 0
        # What the other ingress replicas last reported they have in flight here (the shared
        # load view, load_share.py); 0 with one replica or while the bus is down.
        self.remote_in_flight = 0
        self.remote_queued_tokens = 0
        self.latency: float | None = None
        self._window: deque[bool] = deque(maxlen=SUCCESS_WINDOW)
        self._window_ok = 0
        self.breaker = CircuitBreaker()
        self.healthy = True
        self.health_failures = 0
        # The deadlines of requests waiting for this backend's first byte: when the health
        # checker takes the backend out, they expire at once (retried elsewhere or 503) instead
        # of holding their clients until a timeout (forwarding.py).
        self.first_byte_waits: set[Deadline] = set()

    def reset_history(self) -> None:
        self.latency = None
        self._window.clear()
        self._window_ok = 0
        self.breaker = CircuitBreaker()
        self.healthy = True
        self.health_failures = 0

    # -- reads (CandidateView) -------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Requests in flight on this backend from every replica (the load that bounds)."""
        return self.local_in_flight + self.remote_in_flight

    @property
    def queued_tokens(self) -> int:
        return self.local_queued_tokens + self.remote_queued_tokens

    @property
    def success_rate(self) -> float:
        return self._window_ok / len(self._window) if self._window else 1.0

    def eligible(self, now: float) -> bool:
        return self.healthy and self.breaker.available(now)

    @property
    def breaker_state(self) -> BreakerState:
        return self.breaker.state

    # -- outcomes --------------------------------------------------------------------------
    def begin(self, now: float) -> None:
        self.local_in_flight += 1
        self.breaker.on_start(now)

    def finish(self) -> None:
        self.local_in_flight -= 1

    def queue_prefill(self, tokens: int) -> None:
        self.local_queued_tokens += tokens

    def prefill_done(self, tokens: int) -> None:
        self.local_queued_tokens = max(0, self.local_queued_tokens - tokens)

    def _push(self, ok: bool) -> None:
        if len(self._window) == self._window.maxlen and self._window[0]:
            self._window_ok -= 1
        self._window.append(ok)
        if ok:
            self._window_ok += 1

    def record_success(self, latency: float) -> None:
        self.latency = latency if self.latency is None else self.latency + EWMA_ALPHA * (latency - self.latency)
        self._push(True)
        self.breaker.on_success()

    def record_failure(self, now: float) -> None:
        self._push(False)
        self.breaker.on_failure(now)

    def record_abandon(self, now: float) -> None:
        self.breaker.on_abandon(now)

    def cut_first_byte_waits(self) -> int:
        """Expire every request's wait for this backend's first byte now; returns how many."""
        waits = list(self.first_byte_waits)
        for deadline in waits:
            deadline.expire()
        return len(waits)

    def record_health(self, ok: bool) -> bool:
        """Apply one active health-check result; True when the verdict changed."""
        if ok:
            self.health_failures = 0
            changed = not self.healthy
            self.healthy = True
            return changed
        self.health_failures += 1
        if self.healthy and self.health_failures >= HEALTH_FAILURES_TO_DOWN:
            self.healthy = False
            return True
        return False


class BackendPool:
    """Backend name -> live state, synchronised with each new configuration snapshot."""

    def __init__(self) -> None:
        self._states: dict[str, BackendState] = {}

    def sync(self, backends: Iterable[Backend]) -> None:
        fresh: dict[str, BackendState] = {}
        for spec in backends:
            state = self._states.get(spec.name)
            if state is None:
                state = BackendState(spec)
            else:
                if state.spec.url != spec.url:
                    # A new address is a new server: its history says nothing about this one.
                    # The object itself is kept so requests in flight still count against it.
                    state.reset_history()
                state.spec = spec
                state.weight = spec.weight
            fresh[spec.name] = state
        self._states = fresh

    def get(self, name: str) -> BackendState | None:
        return self._states.get(name)

    def states(self) -> list[BackendState]:
        return list(self._states.values())
