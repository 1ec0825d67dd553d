"""Building the shared load view of an ingress process (a composition helper of app.py).

Whenever this process has peers - sibling workers of one `serve`, or other replicas over NATS -
the app owns one `LoadShare` (load_share.py) over the transports that reach them
(policy/shared_load.py `choose_transports`): Unix datagram sockets between workers, and core
NATS between replicas, on the process's one NATS connection (adapters/nats_link.py). With KV
routing, each worker is a replica on NATS too (its own id, the one its routing decisions
carry); its siblings' reports then also arrive locally, which keeps the workers' view of each
other while NATS is down.
"""

from __future__ import annotations

import os
import secrets
import socket

from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig
from continuum_common.wire.decisions import replica_id
from continuum_ingress.adapters.load_local import LocalLoadTransport
from continuum_ingress.adapters.load_nats import NatsLoadTransport
from continuum_ingress.adapters.nats_link import NatsLink
from continuum_ingress.kv import KvRouting
from continuum_ingress.load_share import LoadShare, LoadTransport, SharedResponses
from continuum_ingress.policy.shared_load import choose_transports
from continuum_ingress.pool import BackendPool
from continuum_ingress.workers import WorkerSeat


def build_load_share(
    config: RouterConfig,
    pool: BackendPool,
    registry: CollectorRegistry,
    *,
    kv: KvRouting | None,
    seat: WorkerSeat | None,
    link: NatsLink | None = None,
    responses: SharedResponses | None = None,
) -> LoadShare | None:
    """The load view for this process, or None when it has no peers (or sharing is off).
    `link`: the process's NATS connection, required when replicas are reached over NATS."""
    settings = config.shared_load()
    chosen = choose_transports(settings, workers=seat.count if seat is not None else 1, kv_routing=kv is not None)
    if not chosen.any:
        return None
    replica = kv.replica if kv is not None else replica_id(socket.gethostname(), os.getpid(), secrets.token_hex(3))
    transports: list[LoadTransport] = []
    if chosen.local and seat is not None:
        transports.append(LocalLoadTransport.for_seat(seat))
    if chosen.bus:
        assert link is not None  # the app makes one whenever a NATS transport can be chosen
        transports.append(NatsLoadTransport(link.nc, replica, connect=link.connected.wait))
    share = LoadShare(
        replica,
        pool,
        transports,
        interval_s=settings.interval_ms / 1000,
        stale_after_s=settings.stale_after_ms / 1000,
        registry=registry,
        responses=responses,
    )
    if kv is not None:
        kv.load_share = share  # the other replicas' shared decisions count at once
    return share
