"""Messages that reach a starting replica twice: live and in the route history's replay.

The live subscription is in place before the replay reads where the stream ends, so what other
replicas publish in between (one round trip to the server, longer under load) is both delivered
live and stored under the stream's last sequence that the replay reads up to. Applying it twice
would count its demand twice. Those messages are the first ones delivered live and the last ones
replayed, so two bounded windows of payload digests are enough to hand each of them on once,
whichever path delivers it first:

- while the replay runs, the first `window` live messages are remembered and skipped when the
  replay reaches them;
- the last `window` replayed messages are remembered and skipped when they arrive live; once the
  replay is over, the first live message that is not one of them ends the overlap (live messages
  arrive in the order they were stored).

Digests are of the subject and payload: a message carries its replica and the time it was made,
so two different messages with the same bytes do not happen.
"""

from __future__ import annotations

from collections import deque

WINDOW = 4096


class ReplayOverlap:
    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.replaying = False
        self.skipped = 0
        self._live: set[int] = set()
        self._replayed: set[int] = set()
        self._replayed_order: deque[int] = deque()

    def start(self) -> None:
        """A replay will read the stream: call it before subscribing to the live subjects, or
        what arrives live in between is not remembered and comes a second time in the replay."""
        self.replaying = True

    def done(self) -> None:
        """The replay ended (read to its end, or gave up): what it handed on is still remembered
        until live delivery has gone past it."""
        self.replaying = False
        self._live.clear()

    def live(self, subject: str, payload: bytes) -> bool:
        """Whether a live message is to be handed on."""
        if not self.replaying and not self._replayed:
            return True
        digest = hash((subject, payload))
        if digest in self._replayed:
            self._replayed.discard(digest)
            self.skipped += 1
            return False
        if self.replaying:
            if len(self._live) < self.window:
                self._live.add(digest)
        else:  # past the overlap: nothing replayed can come live any more
            self._replayed.clear()
            self._replayed_order.clear()
        return True

    def replayed(self, subject: str, payload: bytes) -> bool:
        """Whether a message of the replay is to be handed on."""
        digest = hash((subject, payload))
        if digest in self._live:
            self._live.discard(digest)
            self.skipped += 1
            return False
        self._replayed.add(digest)
        self._replayed_order.append(digest)
        if len(self._replayed_order) > self.window:
            self._replayed.discard(self._replayed_order.popleft())
        return True
