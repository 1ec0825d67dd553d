"""One behavioural suite, three backends: InMemoryKvIndex, RedisKvIndex on a real redis-server,
and RedisKvIndex on a real 3-node Redis Cluster. Every test runs against all three."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from continuum_common.events import EventType, KvEvent, Tier
from continuum_common.kvindex import InMemoryKvIndex, KvHolder, KvIndex, KvIndexWriter, TierPolicy
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import RedisClusterServer, RedisServer
from continuum_testing.kvindex_streams import NaiveIndex, make_stream, prefix

Factory = Callable[..., Any]


@pytest_asyncio.fixture(loop_scope="session", params=["memory", "redis", "cluster"])
async def make_index(
    request: pytest.FixtureRequest, redis_server: RedisServer, redis_cluster: RedisClusterServer
) -> AsyncIterator[Factory]:
    clients: list[Any] = []
    kind = request.param

    def factory(
        *,
        max_entries: int = 100_000,
        ttl: int = 600,
        policy: TierPolicy | None = None,
        grace: float = 300.0,
    ) -> Any:
        if kind == "memory":
            return InMemoryKvIndex(
                max_entries=max_entries, entry_ttl_seconds=ttl, policy=policy, tombstone_grace_s=grace
            )
        if kind == "redis":
            client: Any = aioredis.Redis.from_url(redis_server.url, socket_timeout=5)
        else:
            client = RedisCluster.from_url(redis_cluster.url, socket_timeout=5)
        clients.append(client)
        return RedisKvIndex(
            client, max_entries=max_entries, entry_ttl_seconds=ttl, policy=policy, tombstone_grace_s=grace
        )

    yield factory
    for client in clients:
        await client.aclose()


def ev(
    backend: str,
    seq: int,
    etype: EventType,
    p: int | None = None,
    tokens: int = 0,
    tier: Tier = Tier.GPU_HOT,
    epoch: int = 1,
) -> KvEvent:
    return KvEvent(backend, epoch, seq, 0.0, etype, prefix(p) if p is not None else None, tokens, tier)


C, U, E, OFF, X = EventType.CREATED, EventType.UPDATED, EventType.EVICTED, EventType.OFFLOADED, EventType.CLEARED
HOT, WARM = Tier.GPU_HOT, Tier.STORAGE_WARM


async def test_both_backends_implement_both_protocols(make_index: Factory) -> None:
    index = make_index()
    assert isinstance(index, KvIndex) and isinstance(index, KvIndexWriter)


async def test_created_is_visible_best_first(make_index: Factory) -> None:
    index = make_index()
    report = await index.apply_batch([ev("a", 1, C, 1, 512), ev("b", 1, C, 1, 2048), ev("c", 1, C, 1, 512)])
    assert report.applied == 3 and report.created == {"a": 1, "b": 1, "c": 1}
    assert await index.query_backends(prefix(1)) == [
        KvHolder("b", 2048, HOT),
        KvHolder("a", 512, HOT),
        KvHolder("c", 512, HOT),
    ]
    many = await index.query_many([prefix(1), prefix(2), prefix(1)])
    assert set(many) == {prefix(1), prefix(2)}
    assert many[prefix(2)] == [] and many[prefix(1)][0] == ("b", 2048, HOT)
    assert await index.query_many([]) == {}


async def test_updated_and_evicted_change_the_entry(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batch([ev("a", 1, C, 1, 100), ev("b", 1, C, 1, 300)])
    await index.apply_batch([ev("a", 2, U, 1, 400)])
    assert [h.backend for h in await index.query_backends(prefix(1))] == ["a", "b"]
    report = await index.apply_batch([ev("a", 3, E, 1, 400)])
    assert report.evicted == {"a": 1}
    assert await index.query_backends(prefix(1)) == [KvHolder("b", 300, HOT)]


async def test_duplicates_and_older_events_are_stale(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batch([ev("a", 5, C, 1, 100)])
    report = await index.apply_batch([ev("a", 5, C, 1, 100), ev("a", 4, E, 1), ev("a", 3, U, 1, 999)])
    assert report.applied == 0 and report.stale == 3
    assert await index.query_backends(prefix(1)) == [KvHolder("a", 100, HOT)]
    # a newer epoch wins even with a smaller seq (the listener restarted)
    await index.apply_batch([ev("a", 0, U, 1, 7, epoch=2)])
    assert await index.query_backends(prefix(1)) == [KvHolder("a", 7, HOT)]


async def test_order_within_a_batch_does_not_matter(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batch([ev("a", 3, E, 1), ev("a", 2, U, 1, 50), ev("a", 1, C, 1, 10), ev("a", 4, C, 2, 5)])
    assert await index.query_many([prefix(1), prefix(2)]) == {prefix(1): [], prefix(2): [KvHolder("a", 5, HOT)]}


async def test_cleared_removes_a_backend_and_is_not_undone(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batch([ev("a", 1, C, 1, 10), ev("a", 2, C, 2, 20), ev("b", 1, C, 1, 30)])
    report = await index.apply_batch([ev("a", 10, X)])
    assert report.clears == 1 and report.evicted == {"a": 2}
    assert await index.query_many([prefix(1), prefix(2)]) == {prefix(1): [KvHolder("b", 30, HOT)], prefix(2): []}
    # redelivered older events, for known and for never-seen prefixes, stay cleared
    report = await index.apply_batch([ev("a", 1, C, 1, 10), ev("a", 9, C, 3, 10), ev("a", 10, X)])
    assert report.applied == 0
    assert await index.query_many([prefix(1), prefix(3)]) == {prefix(1): [KvHolder("b", 30, HOT)], prefix(3): []}
    # newer events after the clear count again
    await index.apply_batch([ev("a", 11, C, 1, 40)])
    assert (await index.query_backends(prefix(1)))[0] == KvHolder("a", 40, HOT)


async def test_warm_tier_is_ignored_without_storage_offloading(make_index: Factory) -> None:
    index = make_index()
    report = await index.apply_batch([ev("a", 1, C, 1, 10, WARM), ev("b", 1, C, 1, 10), ev("b", 2, OFF, 1, 10)])
    assert report.ignored == 1
    assert await index.query_backends(prefix(1)) == []


async def test_offload_and_eviction_move_to_warm(make_index: Factory) -> None:
    index = make_index(policy=TierPolicy(track_tiers=True, evict_as_offload=True))
    await index.apply_batch([ev("a", 1, C, 1, 100), ev("b", 1, C, 1, 200), ev("c", 1, C, 1, 50)])
    await index.apply_batch([ev("a", 2, OFF, 1, 100), ev("b", 2, E, 1, 0), ev("c", 2, C, 1, 300, WARM)])
    assert await index.query_backends(prefix(1)) == [
        KvHolder("b", 200, WARM),  # evicted without a count: the warm copy takes the GPU size
        KvHolder("a", 100, WARM),
        KvHolder("c", 50, HOT),  # a GPU copy is reported even when a bigger warm copy exists
    ]
    # evicting a's warm copy removes a; evicting c's GPU copy "offloads" its 50 tokens, and the
    # warm copy takes the event's size (fields are last-writer-wins, never merged)
    await index.apply_batch([ev("a", 3, E, 1, 0, WARM), ev("c", 3, E, 1, 50)])
    assert await index.query_backends(prefix(1)) == [KvHolder("b", 200, WARM), KvHolder("c", 50, WARM)]


async def test_eviction_removes_when_it_is_not_an_offload(make_index: Factory) -> None:
    index = make_index(policy=TierPolicy(track_tiers=True, evict_as_offload=False))
    await index.apply_batch([ev("a", 1, C, 1, 100), ev("b", 1, C, 1, 200)])
    await index.apply_batch([ev("a", 2, E, 1, 100), ev("b", 2, OFF, 1, 200)])
    assert await index.query_backends(prefix(1)) == [KvHolder("b", 200, WARM)]


async def test_ttl_expires_entries_but_not_their_stamps(make_index: Factory) -> None:
    index = make_index(ttl=1, grace=1.0)
    await index.apply_batch([ev("a", 5, C, 1, 100), ev("b", 5, C, 1, 100)])
    assert len(await index.query_backends(prefix(1))) == 2
    await asyncio.sleep(1.15)
    assert await index.query_backends(prefix(1)) == []
    # within the grace: a redelivered old event is still stale; a new one for b does not
    # bring a's expired holding back
    report = await index.apply_batch([ev("a", 4, C, 1, 100), ev("b", 6, U, 1, 10)])
    assert report.applied == 1 and report.stale == 1
    assert await index.query_backends(prefix(1)) == [KvHolder("b", 10, HOT)]
    await asyncio.sleep(2.1)
    assert await index.cleanup_expired() >= 1
    assert (await index.stats()).prefix_count == 0


async def test_max_entries_evicts_the_oldest_tenth(make_index: Factory) -> None:
    index = make_index(max_entries=100)
    for i in range(120):
        await index.apply_batch([ev("a", i + 1, C, i, 10)])
    held = await index.query_many([prefix(i) for i in range(120)])
    alive = [i for i in range(120) if held[prefix(i)]]
    assert 80 <= len(alive) <= 100
    assert alive == list(range(120 - len(alive), 120))  # exactly the newest survive
    assert (await index.stats()).total_evictions >= 20


async def test_max_entries_within_one_batch(make_index: Factory) -> None:
    index = make_index(max_entries=100)
    await index.apply_batch([ev("a", i + 1, C, i, 10) for i in range(150)])
    held = await index.query_many([prefix(i) for i in range(150)])
    alive = [i for i in range(150) if held[prefix(i)]]
    assert 80 <= len(alive) <= 100 and alive[-1] == 149 and 0 not in alive


async def test_a_refreshed_prefix_is_not_the_oldest(make_index: Factory) -> None:
    index = make_index(max_entries=100)
    await index.apply_batch([ev("a", i + 1, C, i, 10) for i in range(100)])
    await index.apply_batch([ev("a", 1000, U, 0, 11)])  # prefix 0 written last now
    await index.apply_batch([ev("a", 1001, C, 100, 10)])  # over the limit: evict the oldest
    held = await index.query_many([prefix(i) for i in (0, 1, 100)])
    assert held[prefix(0)] and held[prefix(100)] and not held[prefix(1)]


async def test_stats_counters_and_clear(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batch([ev("a", 1, C, 1, 10), ev("a", 2, C, 2, 20), ev("b", 1, C, 1, 30), ev("b", 1, C, 1, 30)])
    index.count_events("a", received=2)
    index.count_events("b", received=2, dropped=1)
    stats = await index.stats()
    assert (stats.prefix_count, stats.entry_count) == (2, 3)
    counters = await index.backend_counters()
    assert counters["a"].received == 2 and counters["a"].index_created == 2 and counters["a"].applied == 2
    assert counters["b"].dropped == 1 and counters["b"].stale == 1
    report = await index.clear()
    assert report.entries_before_clear == 3 and report.cleared_entries == 2
    assert await index.query_many([prefix(1), prefix(2)]) == {prefix(1): [], prefix(2): []}
    assert (await index.stats()).prefix_count == 0


@pytest.mark.parametrize("tiers", [False, True])
async def test_shuffled_and_duplicated_streams_match_in_order_delivery(make_index: Factory, tiers: bool) -> None:
    policy = TierPolicy(track_tiers=tiers, evict_as_offload=True)
    rng = random.Random(7 + tiers)
    events = make_stream(rng, backends=("a", "b", "c"), prefixes=25, count=500)
    expected = NaiveIndex(policy)
    for event in events:
        expected.apply(event)

    index = make_index(policy=policy)
    delivered = events + rng.sample(events, len(events) // 3)
    rng.shuffle(delivered)
    while delivered:
        size = rng.randint(1, 60)
        batch, delivered = delivered[:size], delivered[size:]
        await index.apply_batch(batch)
    got = await index.query_many([prefix(i) for i in range(25)])
    assert got == expected.snapshot(range(25))
    assert any(got.values())  # the stream leaves something behind to compare
