"""The HTTP edge: the limits and timeouts a public gateway needs, enforced by the router's HTTP
server protocol (adapters/h1_server.py) with the state kept here.

* **Header size.** httptools buffers a header line until it is complete and has no size limit,
  so a client can make the router hold any amount of memory before a request exists. The bytes
  received while a request head is incomplete are counted per read (bounded by one socket read
  past the limit) and the head of a complete request by its parsed size; over
  `max_header_bytes` the client gets 431 and the connection is closed.
* **Header-read timeout.** From the connection's start, or from the first byte of a new request
  on a kept-alive connection, the head must be complete within `header_timeout` (slow-loris);
  a connection that never sends a byte is closed after the same time.
* **Body-read timeout.** While a request body is being received, `body_timeout` without a byte
  ends it with 408 (a body shorter than its Content-Length no longer holds the client and an
  ASGI task for ever). Time during which the router itself paused reading (the app had not
  consumed the body yet) does not count.
* **Idle keep-alive timeout.** A kept-alive connection with no new request for
  `keepalive_timeout` is closed (not counted: an idle client is not refused).
* **Per-client connection cap.** At most `max_connections_per_client` open connections per
  client address; one more is answered 429 and closed. Behind a load balancer every connection
  comes from the balancer's address, so the cap must exceed what the balancer opens (0: no cap).

Every refusal is counted in `continuum_ingress_edge_rejections_total{reason}` and answered with
an OpenAI-style error body. The `EdgeGuard` is shared by every connection of one server: it
holds the per-client counts and runs the one sweep that checks every connection's deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from continuum_common.config.router import Server

EDGE_REASONS = (
    "header_too_large",
    "header_timeout",
    "idle_timeout",
    "body_timeout",
    "client_connections",
    "invalid_http",
)
LINGER_S = 2.0  # how long a refused connection is drained before it is closed
_STATUS_TEXT = {
    400: b"Bad Request",
    408: b"Request Timeout",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
}


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 30.0
    max_connections_per_client: int = 1024  # 0: no cap

    @classmethod
    def from_config(cls, server: Server) -> EdgeLimits:
        return cls(
            max_header_bytes=server.max_header_bytes,
            header_timeout=server.header_timeout,
            body_timeout=server.body_timeout,
            keepalive_timeout=server.keepalive_timeout,
            max_connections_per_client=server.max_connections_per_client,
        )


def edge_error(status: int, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI-style error body that closes the connection."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}})
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
    return head % (status, _STATUS_TEXT[status], len(body)) + body


class Expiring(Protocol):
    """A connection with a deadline (adapters/h1_server.H1ServerProtocol)."""

    loop: asyncio.AbstractEventLoop
    deadline: float
    deadline_kind: str  # empty: no deadline now

    def expired(self, now: float) -> None: ...


class EdgeGuard:
    """The limits, the per-client connection counts and the rejection counters of one server."""

    def __init__(self, limits: EdgeLimits, registry: CollectorRegistry | None = None) -> None:
        self.limits = limits
        self._per_client: dict[str, int] = {}
        self.open_connections = 0
        self._tracked: set[Expiring] = set()
        self._sweep: asyncio.TimerHandle | None = None
        shortest = min(limits.header_timeout, limits.body_timeout, limits.keepalive_timeout)
        self._interval = min(1.0, max(0.01, shortest / 4))
        rejections = Counter(
            "continuum_ingress_edge_rejections",
            "Connections or requests refused at the HTTP edge (size limits, timeouts, connection cap)",
            ["reason"],
            registry=registry,
        )
        self._rejections = {reason: rejections.labels(reason) for reason in EDGE_REASONS}
        Gauge(
            "continuum_ingress_open_connections", "Client connections open on this process", registry=registry
        ).set_function(lambda: self.open_connections)

    def admit(self, client: str) -> bool:
        cap = self.limits.max_connections_per_client
        count = self._per_client.get(client, 0)
        if cap and count >= cap:
            return False
        self._per_client[client] = count + 1
        self.open_connections += 1
        return True

    def release(self, client: str) -> None:
        count = self._per_client.get(client, 0) - 1
        if count > 0:
            self._per_client[client] = count
        else:
            self._per_client.pop(client, None)
        self.open_connections -= 1

    def connections_of(self, client: str) -> int:
        return self._per_client.get(client, 0)

    def rejected(self, reason: str) -> None:
        self._rejections[reason].inc()

    # -- the timeouts ----------------------------------------------------------------------
    def track(self, conn: Expiring) -> None:
        """Watch a connection's deadline until `untrack`. One sweep per server checks every
        tracked connection (a timer per request would cost the hot path a timer armed and
        cancelled per request); a deadline is acted on within a quarter of the shortest timeout
        (at most a second) after it passed."""
        self._tracked.add(conn)
        if self._sweep is None:
            self._sweep = conn.loop.call_later(self._interval, self._run_sweep, conn.loop)

    def untrack(self, conn: Expiring) -> None:
        self._tracked.discard(conn)

    def _run_sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for conn in [c for c in self._tracked if c.deadline_kind and c.deadline <= now]:
            conn.expired(now)
        self._sweep = loop.call_later(self._interval, self._run_sweep, loop) if self._tracked else None
