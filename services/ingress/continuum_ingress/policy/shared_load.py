"""The other ingress processes' load on each backend, as they last reported it (pure; the
reports travel over NATS between replicas and over Unix datagram sockets between the workers of
one `serve`: continuum_common.wire.loads, load_share.py).

A replica's report replaces its previous one. Between two reports, a routing decision the
replica shares (kv/adapters/decisions.py) adds its request at once (`bump`), so a burst routed
by one replica is seen by the others within milliseconds rather than at the next report; the
next report, which counts that request itself, replaces the bump. A replica not heard from
within the staleness bound is forgotten: when the bus is down every replica falls back to its
own counts instead of routing on a frozen view.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from continuum_common.config.kv_index import LoadSharing
from continuum_common.wire.loads import LoadReport

# A peer is stale after max(stale_after, STALE_INTERVALS × its own report interval): a replica
# configured with a slower cadence is not dropped between two of its reports.
STALE_INTERVALS = 3


@dataclass(slots=True)
class _Peer:
    seq: int
    heard: float  # this replica's clock when the last report arrived
    stale_s: float
    in_flight: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Transports:
    """Where this process exchanges load reports."""

    local: bool  # with its sibling workers (Unix datagram sockets)
    bus: bool  # with the other replicas (NATS)

    @property
    def any(self) -> bool:
        return self.local or self.bus


def choose_transports(settings: LoadSharing, *, workers: int, kv_routing: bool) -> Transports:
    """Siblings share locally whenever there are some; replicas share over NATS while KV
    routing is on (`bus: auto`, on its connection) or always (`bus: always`)."""
    if not settings.enabled:
        return Transports(local=False, bus=False)
    bus = settings.bus == "always" or (settings.bus == "auto" and kv_routing)
    return Transports(local=workers > 1, bus=bus)


@dataclass(frozen=True, slots=True)
class Totals:
    """The fresh peers' load, summed per backend."""

    in_flight: dict[str, int]
    queued_tokens: dict[str, int]
    peers: int


class SharedLoad:
    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self._peers: dict[str, _Peer] = {}
        self.expired = 0  # peers forgotten for silence (not for a final report)

    def __len__(self) -> int:
        return len(self._peers)

    def last_seq(self, replica: str) -> int | None:
        """The sequence number of the report taken last from `replica` (None: none held)."""
        peer = self._peers.get(replica)
        return None if peer is None else peer.seq

    def apply(self, report: LoadReport, now: float) -> bool:
        """Take a peer's report; False when it is older than one already taken (reordered)."""
        peer = self._peers.get(report.replica)
        if peer is not None and report.seq <= peer.seq:
            return False
        if report.final:
            self._peers.pop(report.replica, None)
            return True
        stale_s = max(self.stale_after_s, STALE_INTERVALS * report.interval_ms / 1000)
        fresh = _Peer(report.seq, now, stale_s)
        for load in report.loads:
            fresh.in_flight[load.backend] = fresh.in_flight.get(load.backend, 0) + load.in_flight
            fresh.queued[load.backend] = fresh.queued.get(load.backend, 0) + load.queued_tokens
        self._peers[report.replica] = fresh
        return True

    def bump(self, replica: str, backend: str, queued_tokens: int) -> bool:
        """A peer routed one more request to `backend` since its last report. Only peers known
        from a report are bumped: a peer that shares decisions but no load reports never would
        replace the bumps, and they would only grow."""
        peer = self._peers.get(replica)
        if peer is None:
            return False
        peer.in_flight[backend] = peer.in_flight.get(backend, 0) + 1
        peer.queued[backend] = peer.queued.get(backend, 0) + queued_tokens
        return True

    def totals(self, now: float) -> Totals:
        """Forget stale peers, then sum the rest."""
        for replica in [r for r, p in self._peers.items() if now - p.heard > p.stale_s]:
            del self._peers[replica]
            self.expired += 1
        in_flight: dict[str, int] = {}
        queued: dict[str, int] = {}
        for peer in self._peers.values():
            for backend, n in peer.in_flight.items():
                in_flight[backend] = in_flight.get(backend, 0) + n
            for backend, n in peer.queued.items():
                queued[backend] = queued.get(backend, 0) + n
        return Totals(in_flight, queued, len(self._peers))

    def clear(self) -> None:
        self._peers.clear()
