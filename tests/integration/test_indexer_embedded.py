"""Embedded memory mode (what the ingress runs with `kv_cache_index.backend: memory`), SSE-vs-bus
source selection, and the Redis clear-race compensation, against real NATS and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import random

import redis.asyncio as aioredis
from nats.js.api import AckPolicy

from continuum_common.events import STREAM_NAME, EventType, KvEvent, Tier
from continuum_common.kvindex import KvHolder
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import NatsServer, RedisServer
from continuum_indexer.app import IndexerApp
from continuum_indexer.embedded import EmbeddedKvIndex
from continuum_testing.indexer_harness import ensure_stream, publish, router_config, running, settings, wait_drained
from continuum_testing.kvindex_streams import make_stream, prefix
from tests.integration.test_indexer_consumer import PREFIXES, expected


async def test_embedded_index_replays_then_follows_the_stream(nats_server: NatsServer) -> None:
    import nats

    events = make_stream(random.Random(21), backends=("a", "b"), prefixes=PREFIXES, count=1200)
    config = router_config(nats_server.url, backend="memory")
    await ensure_stream(nats_server.url)
    await publish(nats_server.url, events[:600], dedupe=True)  # before the ingress starts
    nc = await nats.connect(nats_server.url)
    replicas = [EmbeddedKvIndex(config, nc, maintenance_interval_s=0.2) for _ in range(2)]
    tasks = [asyncio.create_task(r.run()) for r in replicas]
    try:
        await publish(nats_server.url, events[600:], dedupe=True)
        want = expected(events)
        for replica in replicas:  # each ingress replica holds the whole index
            for _ in range(500):
                if await replica.index.query_many([prefix(i) for i in range(PREFIXES)]) == want:
                    break
                await asyncio.sleep(0.02)
            assert await replica.index.query_many([prefix(i) for i in range(PREFIXES)]) == want
        assert replicas[0].feeds.consumer.stats.events_received == len(events)
        # private consumers ack nothing (AckPolicy NONE) and still get every message, beyond
        # one pull's batch
        infos = await nc.jetstream().consumers_info(STREAM_NAME)
        assert len(infos) == 2
        for info in infos:
            assert info.config.ack_policy == AckPolicy.NONE
            assert info.num_pending == 0 and info.num_ack_pending == 0
            assert info.delivered is not None and info.delivered.stream_seq == len(events)
    finally:
        for replica in replicas:
            replica.stop()
        _, pending = await asyncio.wait(tasks, timeout=10)
        for task in pending:  # never leave a consumer running into the next test
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await nc.close()


async def test_bus_events_of_sse_backends_are_skipped(nats_server: NatsServer, redis_server: RedisServer) -> None:
    config = router_config(
        nats_server.url,
        redis_server.url,
        event_sources=[
            {"backend_name": "a", "endpoint": "http://127.0.0.1:9/events/a", "reconnect_interval_ms": 60000},
            {"backend_name": "b", "transport": "event_bus"},
        ],
    )
    app = IndexerApp(settings(config))
    async with running(app):
        await publish(
            nats_server.url,
            [
                KvEvent("a", 1, 1, 1.0, EventType.CREATED, prefix(0), 10),
                KvEvent("b", 1, 1, 1.0, EventType.CREATED, prefix(0), 20),
            ],
        )
        await wait_drained(nats_server.url)
        assert app.index is not None
        assert await app.index.query_backends(prefix(0)) == [KvHolder("b", 20, Tier.GPU_HOT)]
        assert app.metrics.dropped.labels("a", "not_bus_source")._value.get() == 1


async def test_a_concurrent_clear_is_not_undone_by_a_stale_watermark(redis_server: RedisServer) -> None:
    """Replica A still believes backend a was never cleared when it applies an old event to a
    prefix replica B's clear walk did not see; A's watermark re-read must clear it again."""
    clients = [aioredis.Redis.from_url(redis_server.url) for _ in range(2)]
    a, b = (RedisKvIndex(c, owns_client=True) for c in clients)
    try:
        await a.apply_batch([KvEvent("a", 1, 1, 1.0, EventType.CREATED, prefix(0), 10)])  # caches "no clear"
        await b.apply_batch([KvEvent("a", 1, 10, 1.0, EventType.CLEARED, None)])
        report = await a.apply_batch([KvEvent("a", 1, 5, 1.0, EventType.CREATED, prefix(1), 10)])
        assert report.applied == 1  # written with the stale watermark...
        assert report.evicted == {"a": 1}  # ...and cleared again by the re-read
        assert await a.query_many([prefix(0), prefix(1)]) == {prefix(0): [], prefix(1): []}
        await a.apply_batch([KvEvent("a", 1, 11, 1.0, EventType.CREATED, prefix(1), 7)])
        assert await b.query_backends(prefix(1)) == [KvHolder("a", 7, Tier.GPU_HOT)]
    finally:
        for index in (a, b):
            with contextlib.suppress(Exception):
                await index.close()


async def test_memory_and_redis_agree_on_one_stream(redis_server: RedisServer) -> None:
    from continuum_common.kvindex import InMemoryKvIndex

    events = make_stream(random.Random(22), backends=("a", "b", "c"), prefixes=PREFIXES, count=2000)
    memory = InMemoryKvIndex()
    redis_index = RedisKvIndex(aioredis.Redis.from_url(redis_server.url), owns_client=True)
    try:
        for start in range(0, len(events), 97):
            await memory.apply_batch(events[start : start + 97])
            await redis_index.apply_batch(events[start : start + 97])
        prefixes = [prefix(i) for i in range(PREFIXES)]
        assert await memory.query_many(prefixes) == await redis_index.query_many(prefixes)
        mem_counters, redis_counters = await memory.backend_counters(), await redis_index.backend_counters()
        assert mem_counters == redis_counters
    finally:
        await redis_index.close()


async def test_redis_losing_its_scripts_is_survived(redis_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    index = RedisKvIndex(client, owns_client=True)
    try:
        await index.apply_batch([KvEvent("a", 1, 1, 1.0, EventType.CREATED, prefix(0), 10)])
        await client.script_flush()  # what a Redis restart or failover does to the script cache
        await index.apply_batch([KvEvent("a", 1, 2, 1.0, EventType.UPDATED, prefix(0), 20)])
        assert await index.query_backends(prefix(0)) == [KvHolder("a", 20, Tier.GPU_HOT)]
    finally:
        await index.close()
