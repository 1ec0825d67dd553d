"""The seam for `kv_cache_index.backend: memory`: a KV index this process feeds itself.

With the memory backend there is no indexer process and no Redis: each ingress process holds the
whole index (prefix keys and engine block hashes) and feeds it from the bus (a private JetStream
consumer) and from `transport: sse` sources. That feed is the indexer's consumer code running in
this process, so the ingress does not build it: the launcher (`continuum-router`) hands
`KvRouting` a factory, and the ingress sees only this interface.

    kv = factory(config, nc, registry=registry, maintenance_interval_s=30.0)
    holders = await kv.index.query_many(prefixes)        # a KvIndex
    matches = kv.blocks.match_nowait(chain, backends)    # synchronous, no await
    task = create_task(kv.run()); await kv.ready.wait()  # fed: replayed, then following
    kv.stop()                                            # at shutdown; run() returns after the batch in hand
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig
from continuum_common.kvindex import InMemoryBlockIndex, InMemoryKvIndex
from continuum_common.wire.indexer_admin import SourceStats


class EmbeddedIndex(Protocol):
    """The in-process index and its feed."""

    @property
    def index(self) -> InMemoryKvIndex: ...

    @property
    def blocks(self) -> InMemoryBlockIndex: ...

    @property
    def ready(self) -> asyncio.Event:
        """Set once the bus feed has replayed the stream's recent history and follows it live."""
        ...

    def source_stats(self) -> Sequence[SourceStats]:
        """The feed's sources (the bus consumer, each SSE source) for the admin answers."""
        ...

    async def run(self) -> None: ...

    def stop(self) -> None: ...


class EmbeddedIndexFactory(Protocol):
    """Builds the embedded index on the ingress's NATS client (not yet connected: `run()` is
    called once it is), with its metrics in the ingress's registry."""

    def __call__(
        self, config: RouterConfig, nc: NatsClient, *, registry: CollectorRegistry, maintenance_interval_s: float
    ) -> EmbeddedIndex: ...
