"""When each request reached each point inside the engine, by the caller's `x-request-id`.

A benchmark that stamps its own sends and first tokens on the same clock can then split a
request's time to first token into legs: the way to the engine's HTTP handler, the body read,
the engine's own work, and the first token's way back. The metrics' means cannot say which leg
a router lengthens, and one slow leg hides in another's noise.

Times are `time.monotonic()` seconds: CLOCK_MONOTONIC on Linux, the same clock in every process
of the host, so an engine's stamps compare with the client's and the router's. Only requests
that carry an id are recorded, at most `capacity` of them until the log is read (`drain`); the
oldest go first, counted. Ids, never prompt text.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_CAPACITY = 100_000
MAX_ID = 200  # characters: a longer header is not an id this log keeps


@dataclass(slots=True)
class RequestTimes:
    head: float  # the HTTP handler began (the request's head parsed)
    arrived: float | None = None  # its body read: where the engine's time-to-first-token clock starts
    submitted: float | None = None  # rendered and tokenized, handed to the scheduler
    # The stream's first chunk (a chat stream's role chunk) and its first content (the chunk
    # after a chat stream's role chunk; a completion stream's first), each stamped as it is
    # handed to the HTTP server, just before its write: a client in the same process (another
    # thread) could otherwise read it before a stamp taken after the write.
    first_chunk: float | None = None
    first_content: float | None = None


class TimeLog:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.dropped = 0
        self._times: OrderedDict[str, RequestTimes] = OrderedDict()

    def start(self, request_id: str | None, head: float) -> RequestTimes | None:
        """A record for this request, or None when it carries no usable id."""
        if not request_id or len(request_id) > MAX_ID:
            return None
        times = RequestTimes(head)
        self._times[request_id] = times  # a repeated id keeps the latest request
        self._times.move_to_end(request_id)
        while len(self._times) > self.capacity:
            self._times.popitem(last=False)
            self.dropped += 1
        return times

    def drain(self) -> dict[str, Any]:
        """Everything recorded since the last drain, and how many records were dropped."""
        out = {"requests": [{"id": rid, **asdict(t)} for rid, t in self._times.items()], "dropped": self.dropped}
        self._times = OrderedDict()
        self.dropped = 0
        return out
