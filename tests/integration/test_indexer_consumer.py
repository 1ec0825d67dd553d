"""The indexer against real nats-server (JetStream) and redis-server / Redis Cluster processes:
at-least-once delivery in every shape ends in the index of in-order exactly-once delivery."""

from __future__ import annotations

import asyncio
import random
import time

import nats
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from continuum_common.events import EventType, KvEvent, Tier
from continuum_common.kvindex import KvHolder, TierPolicy
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import NatsServer, RedisClusterServer, RedisServer
from continuum_indexer.app import IndexerApp
from continuum_testing.indexer_harness import (
    ensure_stream,
    publish,
    router_config,
    running,
    settings,
    snapshot,
    wait_drained,
)
from continuum_testing.kvindex_streams import NaiveIndex, make_stream, prefix

PREFIXES = 40


def stream(seed: int, count: int = 3000) -> list[KvEvent]:
    return make_stream(random.Random(seed), backends=("a", "b", "c"), prefixes=PREFIXES, count=count)


def expected(events: list[KvEvent], policy: TierPolicy | None = None) -> dict[str, list[KvHolder]]:
    naive = NaiveIndex(policy or TierPolicy())
    for event in events:
        naive.apply(event)
    return naive.snapshot(range(PREFIXES))


def reader(redis_url: str, *, cluster: bool = False) -> RedisKvIndex:
    client = RedisCluster.from_url(redis_url) if cluster else aioredis.Redis.from_url(redis_url)
    return RedisKvIndex(client, owns_client=True)


async def test_in_order_stream_builds_the_index(nats_server: NatsServer, redis_server: RedisServer) -> None:
    events = stream(1)
    config = router_config(nats_server.url, redis_server.url)
    app = IndexerApp(settings(config))
    async with running(app):
        await publish(nats_server.url, events, dedupe=True)
        await wait_drained(nats_server.url)
    index = reader(redis_server.url)
    try:
        got = await snapshot(index, PREFIXES)
    finally:
        await index.close()
    assert got == expected(events) and any(got.values())


async def test_duplicated_and_shuffled_stream_gives_the_same_index(
    nats_server: NatsServer, redis_server: RedisServer
) -> None:
    events = stream(2)
    rng = random.Random(3)
    delivered = events + rng.sample(events, len(events) // 2)
    rng.shuffle(delivered)
    config = router_config(nats_server.url, redis_server.url)
    app = IndexerApp(settings(config, batch=200))
    async with running(app):
        await publish(nats_server.url, delivered)
        await wait_drained(nats_server.url)
        assert app.metrics.applied.labels("stale")._value.get() > 0  # the duplicates were seen
    index = reader(redis_server.url)
    try:
        assert await snapshot(index, PREFIXES) == expected(events)
    finally:
        await index.close()


async def test_cancelled_mid_stream_and_restarted_loses_nothing(
    nats_server: NatsServer, redis_server: RedisServer
) -> None:
    events = stream(4, count=6000)
    config = router_config(nats_server.url, redis_server.url)
    await ensure_stream(nats_server.url)
    await publish(nats_server.url, events, dedupe=True)
    # a short ack_wait: the batches the dead indexer held come back quickly
    app = IndexerApp(settings(config, batch=100, ack_wait_s=1.0))
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        async with asyncio.timeout(20):
            while app.feeds is None or app.feeds.sink.last_apply_at is None:
                if task.done():
                    task.result()  # surface why the indexer stopped
                await asyncio.sleep(0.005)
    finally:
        task.cancel()  # no graceful stop: batches may be applied and not acked, or half written
        await asyncio.gather(task, return_exceptions=True)
    assert app.feeds is not None
    received = app.feeds.consumer.stats.events_received
    assert 0 < received < len(events), "the indexer must be stopped mid-stream"

    async with running(IndexerApp(settings(config, batch=100, ack_wait_s=1.0))):
        await wait_drained(nats_server.url)
    index = reader(redis_server.url)
    try:
        assert await snapshot(index, PREFIXES) == expected(events)
    finally:
        await index.close()


async def test_two_replicas_agree_with_one(nats_server: NatsServer, redis_server: RedisServer) -> None:
    events = stream(5, count=4000)
    rng = random.Random(6)
    delivered = events + rng.sample(events, 500)
    rng.shuffle(delivered)
    config = router_config(nats_server.url, redis_server.url)
    one, two = IndexerApp(settings(config, batch=50)), IndexerApp(settings(config, batch=50))
    async with running(one), running(two):
        await publish(nats_server.url, delivered)
        await wait_drained(nats_server.url)
    assert one.feeds is not None and two.feeds is not None
    assert one.feeds.consumer.stats.events_received > 0 and two.feeds.consumer.stats.events_received > 0
    index = reader(redis_server.url)
    try:
        assert await snapshot(index, PREFIXES) == expected(events)
    finally:
        await index.close()


async def test_redis_cluster_backend(nats_server: NatsServer, redis_cluster: RedisClusterServer) -> None:
    policy = TierPolicy(track_tiers=True, evict_as_offload=True)
    events = stream(7, count=2000)
    config = router_config(nats_server.url, redis_cluster.url, cluster=True, storage_offloading={"enabled": True})
    async with running(IndexerApp(settings(config, batch=100))):
        await publish(nats_server.url, events[::-1])  # reversed: everything arrives out of order
        await wait_drained(nats_server.url)
    index = RedisKvIndex(RedisCluster.from_url(redis_cluster.url), policy=policy, owns_client=True)
    try:
        got = await snapshot(index, PREFIXES)
    finally:
        await index.close()
    assert got == expected(events, policy)
    assert any(h.tier is Tier.STORAGE_WARM for holders in got.values() for h in holders)


async def test_bad_messages_are_counted_terminated_and_do_not_block(
    nats_server: NatsServer, redis_server: RedisServer
) -> None:
    good = KvEvent("a", 1, 1, 1.0, EventType.CREATED, prefix(0), 64)
    later = KvEvent("b", 1, 1, 1.0, EventType.CREATED, prefix(1), 32)
    config = router_config(nats_server.url, redis_server.url)
    app = IndexerApp(settings(config))
    async with running(app):
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await js.publish("continuum.kv.events.a", good.encode())
        await js.publish("continuum.kv.events.a", b"\xc1 not msgpack")
        await js.publish("continuum.kv.events.a", b'{"v": 1, "backend": "a"}')
        await js.publish("continuum.kv.events.c", later.encode())  # payload says b
        await js.publish("continuum.kv.events.b", later.encode())
        await nc.close()
        await wait_drained(nats_server.url)
        dropped = app.metrics.dropped
        assert dropped.labels("a", "decode")._value.get() == 2
        assert dropped.labels("c", "backend_mismatch")._value.get() == 1
        assert app.index is not None
        assert await app.index.query_many([prefix(0), prefix(1)]) == {
            prefix(0): [KvHolder("a", 64, Tier.GPU_HOT)],
            prefix(1): [KvHolder("b", 32, Tier.GPU_HOT)],
        }
        counters = await app.index.backend_counters()
        assert counters["a"].dropped == 2 and counters["a"].received == 1


async def test_redis_outage_naks_and_recovers(nats_server: NatsServer, fresh_redis_server: RedisServer) -> None:
    events = make_stream(random.Random(8), backends=("a", "b", "c"), prefixes=PREFIXES, count=1500, clears=False)
    config = router_config(nats_server.url, fresh_redis_server.url)
    app = IndexerApp(settings(config, batch=200))
    async with running(app):
        await publish(nats_server.url, events[:500], dedupe=True)
        await wait_drained(nats_server.url)
        await fresh_redis_server.kill()
        await publish(nats_server.url, events[500:], dedupe=True)
        while app.metrics.errors.labels("apply")._value.get() < 2 or app.health()[0]:
            await asyncio.sleep(0.05)
        assert app.health()[1]["index_ok"] is False
        await fresh_redis_server.start()  # same port, empty: the first 500 are gone with it
        await wait_drained(nats_server.url, timeout=60)
        while not app.health()[0]:
            await asyncio.sleep(0.05)
    index = reader(fresh_redis_server.url)
    try:
        got = await snapshot(index, PREFIXES)
    finally:
        await index.close()
    # Redis came back empty (no persistence); every event published during the outage was
    # naked, redelivered and applied
    assert got == expected(events[500:]) and any(got.values())


async def test_deleted_consumer_and_stream_are_rebound(nats_server: NatsServer, redis_server: RedisServer) -> None:
    config = router_config(nats_server.url, redis_server.url)
    app = IndexerApp(settings(config))
    async with running(app):
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        try:
            await js.delete_consumer("CONTINUUM_KV", "continuum-indexer")  # an operator's mistake
            await asyncio.sleep(0.3)
            await publish(nats_server.url, [KvEvent("a", 1, 1, 1.0, EventType.CREATED, prefix(0), 8)])
            await wait_drained(nats_server.url)
            await js.delete_stream("CONTINUUM_KV")  # and a worse one: the indexer recreates it
            await asyncio.sleep(0.5)
            await publish(nats_server.url, [KvEvent("b", 1, 1, 1.0, EventType.CREATED, prefix(1), 9)])
            await wait_drained(nats_server.url)
        finally:
            await nc.close()
        assert app.index is not None
        assert await app.index.query_many([prefix(0), prefix(1)]) == {
            prefix(0): [KvHolder("a", 8, Tier.GPU_HOT)],
            prefix(1): [KvHolder("b", 9, Tier.GPU_HOT)],
        }


async def test_an_idle_consumer_stops_at_once(nats_server: NatsServer, redis_server: RedisServer) -> None:
    """stop() wakes a pull waiting on an idle stream: with a 30-s idle wait the indexer still
    stops well before it (a restarted ingress or indexer is not held up by its own wait), and
    an event published just before is applied first."""
    config = router_config(nats_server.url, redis_server.url)
    app = IndexerApp(settings(config, idle_wait_s=30.0))
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        async with asyncio.timeout(15):
            while not (app.feeds is not None and app.feeds.consumer.ready.is_set()):
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # the pull is now waiting for the first message
        event = KvEvent("a", 1, 1, 1.0, EventType.CREATED, prefix(0), 10)
        await publish(nats_server.url, [event])
        await wait_drained(nats_server.url)
        await asyncio.sleep(0.3)
        began = time.monotonic()
        stop.set()
        await asyncio.wait_for(asyncio.shield(task), 15.0)
        # Without the wake it waits out the 5-s shutdown grace (then cancels the pull); with it, a
        # few milliseconds. 2 s leaves a noisy machine plenty.
        assert time.monotonic() - began < 2.0
    finally:
        stop.set()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.exception() is None
    index = reader(redis_server.url)
    try:
        assert await index.query_backends(prefix(0)) == [KvHolder("a", 10, Tier.GPU_HOT)]
    finally:
        await index.close()
