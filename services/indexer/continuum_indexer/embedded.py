"""Embedded memory mode (`kv_cache_index.backend: memory`): the ingress process feeds its own
InMemoryKvIndex (prefix keys) and InMemoryBlockIndex (engine block hashes), with no indexer
service and no Redis.

    kv = EmbeddedKvIndex(config, nc, registry=ingress_registry)
    tg.create_task(kv.run())          # in the ingress's TaskGroup; kv.ready is set once it follows
    holders = await kv.index.query_many(prefixes)    # the scorer reads kv.index (a KvIndex)
    matches = kv.blocks.match_nowait(chain, backends)  # synchronous, no await
    ...
    kv.stop()                         # at shutdown; run() returns after the batch in hand

Each ingress replica has a private ephemeral JetStream consumer that first replays the last
`entry_ttl_seconds` of the stream (so a restarted ingress rebuilds its index, as the seed's
does from its SSE streams) and then follows it live; `transport: sse` sources are read
directly. Nothing is shared between replicas: each holds the whole index.

The ingress does not import this module: the launcher passes the class to it as the factory of
its embedded index (continuum_ingress.kv.embedded), whose interface this class implements.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from continuum_common.config.router import RouterConfig
from continuum_common.kvindex import InMemoryBlockIndex, InMemoryKvIndex
from continuum_common.wire.indexer_admin import SourceStats
from continuum_indexer.config import ConsumerSettings, IndexerSettings
from continuum_indexer.index_feeds import IndexFeeds
from continuum_indexer.metrics import IndexerMetrics


class EmbeddedKvIndex:
    def __init__(
        self,
        config: RouterConfig,
        nc: NatsClient,
        *,
        registry: CollectorRegistry | None = None,
        maintenance_interval_s: float = 30.0,
    ) -> None:
        section = config.kv_cache_index
        self.config = config
        self.nc = nc
        self.index = InMemoryKvIndex.from_config(section)
        self.blocks = InMemoryBlockIndex.from_config(section)
        # Before the ingress freezes its start-up heap: see InMemoryBlockIndex.reserve.
        self.blocks.reserve(len(config.backends))
        self.settings = IndexerSettings(
            config=config,
            consumer=ConsumerSettings(durable=None, replay_seconds=float(section.entry_ttl_seconds), acks=False),
            listen=None,
            maintenance_interval_s=maintenance_interval_s,
        )
        self.metrics = IndexerMetrics(self.settings.known_backends(), registry)
        self.feeds = IndexFeeds(self.settings, self.index, nc, self.metrics, self.blocks)

    @property
    def ready(self) -> asyncio.Event:
        """Set once the bus consumer has replayed the stream's recent history and follows it."""
        return self.feeds.consumer.ready

    def source_stats(self) -> list[SourceStats]:
        return self.feeds.source_stats()

    async def run(self) -> None:
        # the consumer ensures the stream before it binds, retrying with backoff
        await self.feeds.run()

    def stop(self) -> None:
        self.feeds.stop()
