"""Version-2 KV batches through the indexer against real nats-server (JetStream) and
redis-server / Redis Cluster processes: at-least-once delivery in every shape ends in the
block index of in-order exactly-once delivery; v1 and v2 share one stream; bad batches are
counted and never block it; Redis outages and a lost script cache lose nothing."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from continuum_common.events import EventType, KvEvent
from continuum_common.kvindex import KvHolder, MatchQuery
from continuum_common.kvindex.adapters.redis_blocks import RedisBlockIndex
from continuum_common.kvindex.block_pack import MAX_SEQ
from continuum_common.procs import NatsServer, RedisClusterServer, RedisServer, free_port
from continuum_common.wire.kv import MAX_EVENTS_PER_BATCH, AllCleared, BlocksStored, KvBatch, encode_batch
from continuum_common.wire.resync import SUBJECT_WILDCARD as RESYNC_WILDCARD
from continuum_common.wire.resync import ResyncRequest, decode_resync_request
from continuum_indexer.app import IndexerApp
from continuum_indexer.embedded import EmbeddedKvIndex
from continuum_testing.indexer_harness import (
    consumer_state,
    ensure_stream,
    publish,
    publish_batches,
    router_config,
    running,
    settings,
    snapshot,
    wait_drained,
)
from continuum_testing.kvindex_block_model import (
    NaiveBlocks,
    batch,
    expected_matches,
    make_batches,
    read_matches,
    universe,
)
from tests.integration.test_indexer_consumer import PREFIXES, expected, reader, stream
from tests.integration.test_indexer_process import start_indexer, write_config

HASHES = universe(40)
BACKENDS = ("a", "b", "c")


def batches(seed: int, count: int = 1500) -> list[KvBatch]:
    return make_batches(random.Random(seed), backends=BACKENDS, hashes=HASHES, count=count)


def want(sent: list[KvBatch]) -> list[dict[str, tuple[int, int, int]]]:
    naive = NaiveBlocks()
    naive.apply_in_order(sent)
    return expected_matches(naive, HASHES, BACKENDS)


def block_reader(url: str, *, cluster: bool = False) -> RedisBlockIndex:
    client = RedisCluster.from_url(url) if cluster else aioredis.Redis.from_url(url)
    return RedisBlockIndex(client, owns_client=True)


async def read_blocks(url: str, *, cluster: bool = False) -> list[dict[str, tuple[int, int, int]]]:
    index = block_reader(url, cluster=cluster)
    try:
        return await read_matches(index, HASHES, BACKENDS)
    finally:
        await index.close()


def shuffled_with_duplicates(sent: list[KvBatch], seed: int, share: float = 0.4) -> list[KvBatch]:
    rng = random.Random(seed)
    delivered = sent + rng.sample(sent, int(len(sent) * share))
    rng.shuffle(delivered)
    return delivered


async def test_batches_end_to_end_in_any_order(nats_server: NatsServer, redis_server: RedisServer) -> None:
    sent = batches(1)
    # small writes: a pull is applied and acked in several parts
    app = IndexerApp(settings(router_config(nats_server.url, redis_server.url), batch=100, block_write_events=64))
    async with running(app):
        # without Msg-Id: JetStream keeps the duplicates, the index's idempotency is what counts
        await publish_batches(nats_server.url, shuffled_with_duplicates(sent, 2))
        await wait_drained(nats_server.url)
        m = app.metrics
        received = sum(m.blocks_received.labels(b)._value.get() for b in BACKENDS)
        applied = m.blocks_applied.labels("applied")._value.get()
        stale = m.blocks_applied.labels("stale")._value.get()
        assert received == applied + stale and stale > 0  # every block event accounted for
        assert m.block_batches.labels("a")._value.get() > 0 and m.block_apply_seconds._sum.get() > 0
    got = await read_blocks(redis_server.url)
    assert got == want(sent) and any(m["a"][0] for m in got)


async def test_v1_and_v2_in_one_stream(nats_server: NatsServer, redis_server: RedisServer) -> None:
    events, sent = stream(3, count=1500), batches(4, count=800)
    rng = random.Random(5)
    mixed: list[KvEvent | KvBatch] = [*events, *sent]
    rng.shuffle(mixed)
    app = IndexerApp(settings(router_config(nats_server.url, redis_server.url), batch=150))
    async with running(app):
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            for item in mixed:  # one stream, one subject per backend, both versions interleaved
                if isinstance(item, KvBatch):
                    await js.publish(f"continuum.kv.events.{item.backend}", encode_batch(item))
                else:
                    await js.publish(item.subject, item.encode())
        finally:
            await nc.close()
        await wait_drained(nats_server.url)
    index = reader(redis_server.url)
    try:
        prefixes = await snapshot(index, PREFIXES)
    finally:
        await index.close()
    assert prefixes == expected(events) and any(prefixes.values())
    assert await read_blocks(redis_server.url) == want(sent)


async def test_killed_process_restarts_and_loses_no_batch(
    tmp_path: Path, nats_server: NatsServer, redis_server: RedisServer
) -> None:
    sent = batches(6, count=6000)
    config = write_config(tmp_path / "router.yaml", nats_server.url, redis_server.url)
    await ensure_stream(nats_server.url)
    await publish_batches(nats_server.url, sent, dedupe=True)
    port = free_port()
    proc = await start_indexer(config, port, "--batch", "50", "--ack-wait", "1")
    try:
        while (await consumer_state(nats_server.url))[2] < 300:
            await asyncio.sleep(0.002)
        proc.send_signal(signal.SIGKILL)  # mid-stream: batches written and not acked, or half
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    _, _, floor = await consumer_state(nats_server.url)
    assert floor < len(sent), "killed before the stream was consumed"
    proc = await start_indexer(config, port, "--batch", "50", "--ack-wait", "1")
    try:
        await wait_drained(nats_server.url, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    assert await read_blocks(redis_server.url) == want(sent)


async def test_two_replicas_share_the_durable_and_converge(nats_server: NatsServer, redis_server: RedisServer) -> None:
    sent = batches(7, count=3000)
    config = router_config(nats_server.url, redis_server.url)
    one, two = IndexerApp(settings(config, batch=40)), IndexerApp(settings(config, batch=40))
    async with running(one), running(two):
        await publish_batches(nats_server.url, shuffled_with_duplicates(sent, 8, share=0.2))
        await wait_drained(nats_server.url)
    assert one.metrics.block_batches.labels("a")._value.get() > 0
    assert two.metrics.block_batches.labels("a")._value.get() > 0
    assert await read_blocks(redis_server.url) == want(sent)


async def test_redis_cluster(nats_server: NatsServer, redis_cluster: RedisClusterServer) -> None:
    sent = batches(9, count=1200)
    config = router_config(nats_server.url, redis_cluster.url, cluster=True)
    async with running(IndexerApp(settings(config, batch=100))):
        await publish_batches(nats_server.url, sent[::-1])  # reversed: everything arrives out of order
        await wait_drained(nats_server.url)
    assert await read_blocks(redis_cluster.url, cluster=True) == want(sent)


async def test_bad_batches_are_counted_and_do_not_block(nats_server: NatsServer, redis_server: RedisServer) -> None:
    h = HASHES
    app = IndexerApp(settings(router_config(nats_server.url, redis_server.url)))
    async with running(app):
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            send = js.publish
            await send("continuum.kv.events.a", encode_batch(batch("a", 1, AllCleared(), BlocksStored(h[:3]))))
            huge = KvBatch("a", 1, 2, 0.0, [AllCleared()] * (MAX_EVENTS_PER_BATCH + 1))
            await send("continuum.kv.events.a", encode_batch(huge))  # over the decoder's bound
            await send("continuum.kv.events.a", encode_batch(batch("a", 3, BlocksStored(h[3:4]), epoch=2))[:-3])
            await send("continuum.kv.events.c", encode_batch(batch("b", 1, BlocksStored(h[:2]))))  # says b
            await send("continuum.kv.events.a", encode_batch(batch("a", MAX_SEQ, BlocksStored(h[5:9]))))
            # a backend no configuration names is indexed (its metrics label is `other`)
            await send("continuum.kv.events.zz-9", encode_batch(batch("zz-9", 1, BlocksStored(h[:4]))))
            await send("continuum.kv.events.b", encode_batch(batch("b", 1, BlocksStored(h[:2]))))
        finally:
            await nc.close()
        await wait_drained(nats_server.url)
        drops = app.metrics.dropped
        assert drops.labels("a", "too_large")._value.get() == 1
        assert drops.labels("a", "decode")._value.get() == 1
        assert drops.labels("a", "invalid")._value.get() == 1
        assert drops.labels("c", "backend_mismatch")._value.get() == 1
        assert app.metrics.block_batches.labels("other")._value.get() == 1
        assert app.blocks is not None
        (got,) = await app.blocks.match_many([MatchQuery(h[:4], ["a", "b", "zz-9"])])
        assert {b: m.gpu_blocks for b, m in got.items()} == {"a": 3, "b": 2, "zz-9": 4}
        assert (await app.blocks.block_stats()).backends["a"].batches == 1


async def test_redis_outage_naks_and_recovers(nats_server: NatsServer, fresh_redis_server: RedisServer) -> None:
    sent = batches(10, count=1200)
    first, rest = sent[:400], sent[400:]
    app = IndexerApp(settings(router_config(nats_server.url, fresh_redis_server.url), batch=100))
    async with running(app):
        await publish_batches(nats_server.url, first, dedupe=True)
        await wait_drained(nats_server.url)
        await fresh_redis_server.kill()
        await publish_batches(nats_server.url, rest, dedupe=True)
        while app.metrics.errors.labels("apply")._value.get() < 2:
            await asyncio.sleep(0.05)
        await fresh_redis_server.start()  # same port, empty: what was written before is gone
        await wait_drained(nats_server.url, timeout=60)
    # every batch published during the outage was naked, redelivered and applied
    naive = NaiveBlocks()
    naive.apply_in_order(rest)
    assert await read_blocks(fresh_redis_server.url) == expected_matches(naive, HASHES, BACKENDS)


async def test_a_lost_script_cache_under_a_running_indexer(nats_server: NatsServer, redis_server: RedisServer) -> None:
    sent = batches(11, count=900)
    app = IndexerApp(settings(router_config(nats_server.url, redis_server.url), batch=50))
    async with running(app):
        client = aioredis.Redis.from_url(redis_server.url)
        try:
            for part in (sent[:300], sent[300:600], sent[600:]):
                await publish_batches(nats_server.url, part, dedupe=True)
                await wait_drained(nats_server.url)
                await client.script_flush()
        finally:
            await client.aclose()
        assert app.metrics.errors.labels("apply")._value.get() == 0  # reloaded, never a failure
    assert await read_blocks(redis_server.url) == want(sent)


async def test_embedded_memory_mode_feeds_blocks(nats_server: NatsServer) -> None:
    sent = batches(12, count=900)
    event = KvEvent("a", 1, 1, 0.0, EventType.CREATED, "ab" * 32, 64)
    config = router_config(nats_server.url, backend="memory")
    await ensure_stream(nats_server.url)
    await publish_batches(nats_server.url, sent[:450], dedupe=True)  # before the ingress starts
    await publish(nats_server.url, [event])
    nc = await nats.connect(nats_server.url)
    kv = EmbeddedKvIndex(config, nc, maintenance_interval_s=0.2)
    task = asyncio.create_task(kv.run())
    try:
        await publish_batches(nats_server.url, shuffled_with_duplicates(sent[450:], 13), dedupe=False)
        expect = want(sent)
        for _ in range(500):
            if await read_matches(kv.blocks, HASHES, BACKENDS) == expect:
                break
            await asyncio.sleep(0.02)
        assert await read_matches(kv.blocks, HASHES, BACKENDS) == expect
        assert kv.blocks.match_nowait(HASHES[:1], ["a"])["a"].generation > 0  # the synchronous read
        assert await kv.index.query_backends("ab" * 32) == [KvHolder("a", 64, event.tier)]
    finally:
        kv.stop()
        try:
            await asyncio.wait_for(task, 10)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await nc.close()


async def test_an_enormous_valid_batch_is_applied_in_parts(nats_server: NatsServer, redis_server: RedisServer) -> None:
    rng = random.Random(14)
    chain = [rng.getrandbits(64) for _ in range(100_000)]  # ~900 KB: under NATS's 1 MB payload
    app = IndexerApp(settings(router_config(nats_server.url, redis_server.url, max_entries=200_000)))
    async with running(app):
        await publish_batches(nats_server.url, [batch("a", 1, AllCleared(), BlocksStored(chain))])
        await wait_drained(nats_server.url, timeout=60)
        assert app.metrics.errors.labels("apply")._value.get() == 0  # no write ran into the timeout
        assert app.blocks is not None
        (got,) = await app.blocks.match_many([MatchQuery(chain, ["a"])])
        assert got["a"].gpu_blocks == 100_000
        assert (await app.blocks.block_stats()).backends["a"].batches == 1


async def test_a_lost_store_asks_each_backends_listener_to_restate_it(
    nats_server: NatsServer, fresh_redis_server: RedisServer
) -> None:
    requests: list[tuple[str, ResyncRequest]] = []
    nc = await nats.connect(nats_server.url)
    try:

        async def on_request(msg: Any) -> None:
            requests.append((msg.subject, decode_resync_request(msg.data)))

        await nc.subscribe(RESYNC_WILDCARD, cb=on_request)
        app = IndexerApp(settings(router_config(nats_server.url, fresh_redis_server.url), batch=100))
        async with running(app):
            # Epochs that start with AllCleared: nothing to ask.
            await publish_batches(
                nats_server.url, [batch("a", 1, AllCleared(), epoch=5), batch("b", 1, AllCleared(), epoch=5)]
            )
            await wait_drained(nats_server.url)
            await asyncio.sleep(0.2)
            assert requests == []
            await fresh_redis_server.kill()
            await fresh_redis_server.start()  # empty: the index lost both backends' history
            later = [batch(b, seq, BlocksStored([HASHES[seq]]), epoch=5) for seq in range(2, 12) for b in ("a", "b")]
            await publish_batches(nats_server.url, later)
            await wait_drained(nats_server.url, timeout=60)
            for _ in range(50):
                if len(requests) >= 2:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            m = app.metrics.block_resyncs
            sent = {b: m.labels(b, "sent")._value.get() for b in ("a", "b")}
    finally:
        await nc.close()
    # One request per backend: once the state exists again, later batches are no gap.
    assert sorted((s, r.backend, r.reason) for s, r in requests) == [
        ("continuum.kv.resync.a", "a", "index_gap"),
        ("continuum.kv.resync.b", "b", "index_gap"),
    ]
    assert sent == {"a": 1, "b": 1}
