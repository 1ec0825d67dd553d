"""The indexer's settings: the router configuration file's `kv_cache_index`, `redis` (or the
seed's `response_cache.redis`) and `bus` sections, plus the indexer-only knobs that have no
place in the shared file (command-line flags of `continuum-indexer`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from continuum_common.config.kv_index import EventSource
from continuum_common.config.router import RouterConfig

DEFAULT_DURABLE = "continuum-indexer"
ADMIN_QUEUE_GROUP = "continuum-indexer-admin"


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """The JetStream pull consumer. `durable=None` makes a private ephemeral consumer that
    replays the stream from `replay_seconds` ago (the embedded memory mode)."""

    durable: str | None = DEFAULT_DURABLE
    batch: int = 500
    concurrency: int = 4  # batches applied at once per consumer (bench/continuum_bench/indexer_apply.py)
    max_ack_pending: int = 8192
    ack_wait_s: float = 30.0
    # How long one wait for messages lasts when the stream is idle (events are delivered to
    # the waiting pull request at once; this only paces the stop check).
    idle_wait_s: float = 0.5
    replay_seconds: float | None = None
    # False: AckPolicy NONE, for a private consumer whose index writes cannot fail (memory)
    acks: bool = True
    # Block events per block-index write: a backlog's pull is applied (and acked) in parts.
    block_write_events: int = 8192
    block_writes_in_flight: int = 2
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0


@dataclass(frozen=True, slots=True)
class IndexerSettings:
    config: RouterConfig
    consumer: ConsumerSettings = field(default_factory=ConsumerSettings)
    nats_url: str | None = None  # overrides bus.url
    listen: tuple[str, int] | None = ("127.0.0.1", 9102)  # /healthz and /metrics; None = off
    maintenance_interval_s: float = 5.0
    shutdown_grace_s: float = 10.0

    @property
    def sse_sources(self) -> list[EventSource]:
        return [s for s in self.config.kv_cache_index.event_sources if s.transport == "sse"]

    @property
    def sse_backends(self) -> frozenset[str]:
        """Backends whose events come over SSE; their bus events are skipped (one transport
        per backend, as in the seed)."""
        return frozenset(s.backend_name for s in self.sse_sources)

    def known_backends(self) -> frozenset[str]:
        """The metric label allow-list: every backend the configuration names."""
        names = {b.name for b in self.config.backends}
        names.update(s.backend_name for s in self.config.kv_cache_index.event_sources)
        return frozenset(names)


def parse_listen(value: str) -> tuple[str, int] | None:
    """`host:port`, `:port` (loopback) or `off`."""
    if value.strip().lower() in ("off", "none", ""):
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {value!r}: expected host:port or off")
    return (host.strip("[]") or "127.0.0.1", int(port))
