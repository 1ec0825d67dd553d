"""Fan-out of normalized events to SSE consumers, with a bounded resume history per backend.

* Every event is framed once (protocol.sse) and kept in a per-backend history of
  `limits.sse_history` records.
* A consumer that sends `Last-Event-ID` of a record still in the history (or the one right
  before its oldest record) gets every later record, then the live feed: nothing duplicated or
  skipped across a reconnect.
* Any other consumer — new, or asking for an id the history no longer holds (older, or of another
  epoch) — gets a *snapshot*: `cache_cleared` (stamped one seq below the newest event), then one
  appearance event per announced (prefix, tier) stamped with the newest event's (epoch, seq), the
  last of them carrying its id, then the live feed. Snapshot
  records before the last have no id, so a consumer cut off mid-snapshot simply gets a new one.
* Each consumer has a bounded queue. A consumer that falls `client_buffer` records behind is sent
  what is queued, then `event: buffer_overflow`, and the stream ends (seed: close, never drop
  silently); it resumes from its last id.
* On shutdown every stream gets `event: draining` and ends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable

from continuum_common.events import EventType, KvEvent, Tier
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.protocol.sse import (
    BUFFER_OVERFLOW,
    DRAINING,
    encode_comment,
    encode_control,
    encode_event,
    parse_event_id,
)

State = Callable[[str], tuple[list[KvEvent], int, int]]  # backend → (announced, epoch, seq)


class Subscriber:
    __slots__ = ("backend", "closed", "limit", "queue", "wake")

    def __init__(self, backend: str, limit: int) -> None:
        self.backend = backend
        self.limit = limit
        self.queue: deque[bytes] = deque()
        self.wake = asyncio.Event()
        self.closed: str | None = None

    def push(self, frame: bytes) -> None:
        if self.closed is not None:
            return
        if len(self.queue) >= self.limit:
            self.close(BUFFER_OVERFLOW)
            return
        self.queue.append(frame)
        self.wake.set()

    def close(self, reason: str) -> None:
        if self.closed is None:
            self.closed = reason
            self.wake.set()


class SseHub:
    def __init__(
        self,
        backends: Iterable[str],
        *,
        history: int,
        state: State,
        metrics: ListenerMetrics,
        client_buffer: int = 4096,
        keepalive: float = 15.0,
    ) -> None:
        self.backends = frozenset(backends)
        self._history: dict[str, deque[tuple[int, int, bytes]]] = {b: deque(maxlen=history) for b in self.backends}
        self._subscribers: dict[str, set[Subscriber]] = {b: set() for b in self.backends}
        self._state = state
        self.metrics = metrics
        self.client_buffer = client_buffer
        self.keepalive = keepalive
        self.draining = False

    def submit(self, event: KvEvent) -> None:
        frame = encode_event(event)
        history = self._history.get(event.backend)
        if history is None:
            return
        history.append((event.source_epoch, event.seq, frame))
        for subscriber in self._subscribers[event.backend]:
            subscriber.push(frame)

    def subscribe(self, backend: str, last_event_id: str | None) -> Subscriber:
        """Register a consumer and queue its catch-up records (atomically: no await here)."""
        subscriber = Subscriber(backend, self.client_buffer)
        for frame in self._catch_up(backend, parse_event_id(last_event_id)):
            subscriber.queue.append(frame)
        self._subscribers[backend].add(subscriber)
        self.metrics.sse_clients.labels(backend).set(len(self._subscribers[backend]))
        return subscriber

    def _catch_up(self, backend: str, last: tuple[int, int] | None) -> list[bytes]:
        history = self._history[backend]
        if last is not None and history:
            oldest = history[0]
            if (oldest[0], oldest[1] - 1) == last:
                return [frame for _, _, frame in history]
            for index in range(len(history) - 1, -1, -1):
                epoch, seq, _ = history[index]
                if (epoch, seq) == last:
                    return [history[i][2] for i in range(index + 1, len(history))]
        announced, epoch, seq = self._state(backend)
        # The appearance events carry the newest event's stamp (epoch, seq). A consumer applies
        # `cleared` as "everything stamped at or below mine is gone", so the snapshot's `cleared`
        # is stamped one below: it voids what the consumer knew before, not the restatement.
        cleared = KvEvent(
            backend, epoch, max(seq - 1, 0), announced[0].ts if announced else 0.0, EventType.CLEARED, None, 0,
            Tier.GPU_HOT,
        )  # fmt: skip
        records = [cleared, *announced]
        return [encode_event(e, with_id=i == len(records) - 1) for i, e in enumerate(records)]

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers[subscriber.backend].discard(subscriber)
        self.metrics.sse_clients.labels(subscriber.backend).set(len(self._subscribers[subscriber.backend]))

    async def stream(self, subscriber: Subscriber) -> AsyncIterator[bytes]:
        try:
            yield encode_comment("continuum-kv-listener")
            while True:
                while subscriber.queue:
                    yield subscriber.queue.popleft()
                if subscriber.closed is not None:
                    self.metrics.sse_closed.labels(subscriber.backend, subscriber.closed).inc()
                    yield encode_control(subscriber.closed, _REASONS[subscriber.closed])
                    return
                subscriber.wake.clear()
                try:
                    await asyncio.wait_for(subscriber.wake.wait(), self.keepalive)
                except TimeoutError:
                    yield encode_comment("keepalive")
        finally:
            self.unsubscribe(subscriber)

    def drain(self) -> None:
        self.draining = True
        for subscribers in self._subscribers.values():
            for subscriber in subscribers:
                subscriber.close(DRAINING)

    def clients(self, backend: str) -> int:
        return len(self._subscribers.get(backend, ()))


_REASONS = {
    BUFFER_OVERFLOW: "consumer too slow; reconnect with Last-Event-ID",
    DRAINING: "listener shutting down; reconnect to another listener",
}
