"""One behavioural suite for the block index, three backends: InMemoryBlockIndex,
RedisBlockIndex on a real redis-server, and RedisBlockIndex on a real 3-node Redis Cluster.
Every test runs against all three (the semantics are continuum_common.kvindex.blocks's)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from continuum_common.kvindex import (
    NO_MATCH,
    BlockIndexReader,
    BlockIndexWriter,
    BlockMatch,
    InMemoryBlockIndex,
    MatchQuery,
)
from continuum_common.kvindex.adapters.redis_blocks import RedisBlockIndex
from continuum_common.kvindex.block_pack import MAX_SEQ
from continuum_common.procs import RedisClusterServer, RedisServer
from continuum_common.wire.kv import AllCleared, BlocksRemoved, BlocksStored, KvBatch
from continuum_testing.kvindex_block_model import NaiveBlocks, batch, make_batches, universe, without_generation

Factory = Callable[..., Any]
H = universe(64)
S, R, X = BlocksStored, BlocksRemoved, AllCleared


@pytest_asyncio.fixture(loop_scope="session", params=["memory", "redis", "cluster"])
async def make_index(
    request: pytest.FixtureRequest, redis_server: RedisServer, redis_cluster: RedisClusterServer
) -> AsyncIterator[Factory]:
    clients: list[Any] = []
    kind = request.param

    def factory(
        *,
        max_blocks: int = 100_000,
        ttl: float = 600.0,
        tombstones: float = 120.0,
        per_call: int = 4096,
        per_pipeline: int = 16_384,
    ) -> Any:
        if kind == "memory":
            return InMemoryBlockIndex(max_blocks=max_blocks, ttl_seconds=ttl, tombstone_seconds=tombstones)
        if kind == "redis":
            client: Any = aioredis.Redis.from_url(redis_server.url, socket_timeout=5)
        else:
            client = RedisCluster.from_url(redis_cluster.url, socket_timeout=5)
        clients.append(client)
        return RedisBlockIndex(
            client,
            max_blocks=max_blocks,
            ttl_seconds=ttl,
            tombstone_seconds=tombstones,
            max_blocks_per_call=per_call,
            max_blocks_per_pipeline=per_pipeline,
        )

    yield factory
    for client in clients:
        await client.aclose()


async def match(index: Any, chain: list[int], *backends: str) -> dict[str, BlockMatch]:
    (result,) = await index.match_many([MatchQuery(chain, backends)])
    return result  # type: ignore[no-any-return]


async def counts(index: Any, chain: list[int], *backends: str) -> dict[str, tuple[int, int, int]]:
    return without_generation(await match(index, chain, *backends))


async def test_implements_both_protocols(make_index: Factory) -> None:
    index = make_index()
    assert isinstance(index, BlockIndexReader) and isinstance(index, BlockIndexWriter)


async def test_match_counts_the_leading_held_blocks(make_index: Factory) -> None:
    index = make_index()
    report = await index.apply_batches([batch("a", 1, X(), S(H[:5])), batch("b", 1, X(), S(H[:2] + H[3:6]))])
    assert (report.batches, report.applied, report.stale, report.clears) == (2, 10, 0, 2)
    # b holds blocks 3..5 too, but not block 2: the match stops at the first block not held
    assert await counts(index, H[:8], "a", "b", "nobody") == {"a": (5, 5, 5), "b": (2, 2, 5), "nobody": (0, 0, 0)}
    assert await counts(index, H[3:7], "a", "b") == {"a": (2, 2, 5), "b": (3, 3, 5)}  # hashes, not positions
    assert await counts(index, [], "a") == {"a": (0, 0, 5)}
    assert (await match(index, H[:1], "nobody"))["nobody"] == NO_MATCH
    many = await index.match_many([MatchQuery(H[:3], ["b", "a"]), MatchQuery(H[:1], []), MatchQuery(H[5:9], ["a"])])
    assert [without_generation(m) for m in many] == [{"b": (2, 2, 5), "a": (3, 3, 5)}, {}, {"a": (0, 0, 5)}]
    assert list(many[0]) == ["b", "a"]
    assert await index.match_many([]) == []


async def test_storage_tier_extends_any_blocks(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batches([batch("a", 1, X(), S(H[:2]), S(H[2:4], tier=1), S(H[5:7]))])
    # blocks 0-1 on GPU, 2-3 in storage, 4 nowhere, 5-6 on GPU again
    assert await counts(index, H[:7], "a") == {"a": (2, 4, 4)}
    await index.apply_batches([batch("a", 2, S(H[4:5], tier=1))])
    assert await counts(index, H[:7], "a") == {"a": (2, 7, 4)}  # GPU blocks past the GPU run count for any
    await index.apply_batches([batch("a", 3, R(H[0:1]))])
    assert await counts(index, H[:7], "a") == {"a": (0, 0, 3)}


async def test_removals_and_stores_are_last_writer_wins(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batches([batch("a", 1, X(), S(H[:4]))])
    # a store and a removal of the same block in one batch apply in event order
    report = await index.apply_batches([batch("a", 3, R(H[1:2]), S(H[1:2]), R(H[2:3]))])
    assert (report.applied, report.stale) == (3, 0)
    assert await counts(index, H[:4], "a") == {"a": (2, 2, 3)}
    # a redelivered batch and an older store of a removed block are stale
    report = await index.apply_batches([batch("a", 2, S(H[2:3])), batch("a", 3, R(H[1:2]), S(H[1:2]), R(H[2:3]))])
    assert (report.applied, report.stale) == (0, 4)
    assert await counts(index, H[:4], "a") == {"a": (2, 2, 3)}
    # the removal of a block never stored leaves a tombstone: its older store arriving late is stale
    await index.apply_batches([batch("a", 10, R(H[10:11]))])
    report = await index.apply_batches([batch("a", 9, S(H[10:11]))])
    assert (report.applied, report.stale) == (0, 1)
    assert await counts(index, H[10:11], "a") == {"a": (0, 0, 3)}
    # duplicates inside one event: the second is stale
    report = await index.apply_batches([batch("a", 11, S([H[20], H[20]]), R([H[0], H[0]]))])
    assert (report.applied, report.stale) == (2, 2)


async def test_all_cleared_is_a_watermark(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batches([batch("a", 1, X(), S(H[:3])), batch("b", 1, X(), S(H[:3]))])
    gen = (await match(index, H[:1], "a"))["a"].generation
    # seq 6 arrives before the AllCleared of seq 5: it survives the clear, everything older goes
    await index.apply_batches([batch("a", 6, S(H[10:12]))])
    report = await index.apply_batches([batch("a", 5, S(H[3:4]), X())])
    assert report.clears == 1
    cleared = await match(index, H[:3], "a", "b")
    assert without_generation(cleared) == {"a": (0, 0, 2), "b": (3, 3, 3)}
    assert cleared["a"].generation != gen
    assert await counts(index, H[10:12], "a") == {"a": (2, 2, 2)}
    # redelivered older stores stay cleared; a repeated AllCleared changes nothing
    report = await index.apply_batches([batch("a", 2, S(H[:3])), batch("a", 5, S(H[3:4]), X())])
    assert (report.applied, report.clears) == (0, 0)
    assert (await match(index, H[:3], "a"))["a"] == BlockMatch(0, 0, 2, cleared["a"].generation)
    # newer stores count again
    await index.apply_batches([batch("a", 7, S(H[:2]))])
    assert await counts(index, H[:3], "a") == {"a": (2, 2, 4)}


async def test_epochs(make_index: Factory) -> None:
    index = make_index()
    await index.apply_batches([batch("a", 1, X(), S(H[:4]), epoch=5)])
    gen = (await match(index, H[:1], "a"))["a"].generation
    report = await index.apply_batches([batch("a", 9, S(H[4:8]), R(H[:1]), epoch=4)])
    assert (report.batches, report.stale_batches, report.stale, report.applied) == (0, 1, 5, 0)
    assert await counts(index, H[:8], "a") == {"a": (4, 4, 4)}
    # the new epoch's seq 2 arrives before its seq 1 (the AllCleared): the old state goes anyway
    await index.apply_batches([batch("a", 2, S(H[20:22]), epoch=6)])
    moved = await match(index, H[:4], "a")
    assert without_generation(moved) == {"a": (0, 0, 2)} and moved["a"].generation != gen
    await index.apply_batches([batch("a", 1, X(), S(H[30:31]), epoch=6)])
    assert await counts(index, H[20:22], "a") == {"a": (2, 2, 3)}
    assert await counts(index, H[30:31], "a") == {"a": (1, 1, 3)}
    # the previous epoch is stale now
    report = await index.apply_batches([batch("a", 100, S(H[:4]), epoch=5)])
    assert report.stale_batches == 1 and await counts(index, H[:4], "a") == {"a": (0, 0, 3)}


async def test_state_is_per_backend(make_index: Factory) -> None:
    index = make_index()
    # the same hashes on two backends, and one's removal or clear never touches the other
    await index.apply_batches([batch("a", 1, X(), S(H[:3])), batch("b", 1, X(), S(H[:3]))])
    await index.apply_batches([batch("a", 2, R(H[:1])), batch("b", 2, S(H[3:4]))])
    assert await counts(index, H[:4], "a", "b") == {"a": (0, 0, 2), "b": (4, 4, 4)}
    await index.apply_batches([batch("b", 3, X())])
    assert await counts(index, H[1:3], "a", "b") == {"a": (2, 2, 2), "b": (0, 0, 0)}


async def test_max_blocks_evicts_the_oldest_stored(make_index: Factory) -> None:
    index = make_index(max_blocks=10)
    await index.apply_batches([batch("a", 1, X(), S(H[:8]))])
    report = await index.apply_batches([batch("a", 2, S(H[8:12]), S(H[40:42], tier=1))])
    assert report.evicted == 2
    assert await counts(index, H[:12], "a") == {"a": (0, 0, 10)}
    assert await counts(index, H[2:12], "a") == {"a": (10, 10, 10)}
    # re-storing a block makes it the newest; an evicted block's old store stays stale
    await index.apply_batches([batch("a", 3, S(H[2:3]), S(H[12:13]))])
    assert await counts(index, H[2:4], "a") == {"a": (1, 1, 10)}
    report = await index.apply_batches([batch("a", 1, X(), S(H[:8]))])
    assert report.applied == 0
    # a newer store brings an evicted block back
    await index.apply_batches([batch("a", 4, S(H[0:1]))])
    assert (await counts(index, H[0:1], "a"))["a"][0] == 1
    stats = await index.block_stats()
    assert stats.backends["a"].gpu_blocks == 10 and stats.backends["a"].evicted >= 4


async def test_a_backend_without_batches_expires(make_index: Factory) -> None:
    index = make_index(ttl=1.0)
    await index.apply_batches([batch("a", 1, X(), S(H[:3])), batch("b", 1, X(), S(H[:3]))])
    gen = (await match(index, H[:1], "a"))["a"].generation
    await asyncio.sleep(0.6)
    await index.apply_batches([batch("b", 2)])  # a keepalive keeps b alive
    await asyncio.sleep(0.6)
    result = await match(index, H[:3], "a", "b")
    assert result["a"] == NO_MATCH and without_generation(result) == {"a": (0, 0, 0), "b": (3, 3, 3)}
    assert "a" not in (await index.block_stats()).backends
    # the next batch starts from nothing, with a new generation
    await index.apply_batches([batch("a", 2, S(H[5:6]))])
    revived = await match(index, H[:3] + H[5:6], "a")
    assert without_generation(revived) == {"a": (0, 0, 1)} and revived["a"].generation not in (0, gen)


async def test_tombstones_are_kept_for_their_window(make_index: Factory) -> None:
    index = make_index(tombstones=0.3)
    await index.apply_batches([batch("a", 1, X(), S(H[:2])), batch("a", 5, R(H[:1]))])
    assert (await index.apply_batches([batch("a", 4, S(H[:1]))])).stale == 1
    # two windows later (rotated by the batches that arrive meanwhile) the tombstone is gone:
    # a store older than the removal would now apply (the window bounds redelivery tolerance)
    for seq in (6, 7, 8):
        await asyncio.sleep(0.35)
        await index.apply_batches([batch("a", seq)])
    assert (await index.apply_batches([batch("a", 4, S(H[:1]))])).applied == 1


async def test_stats_cleanup_and_clear(make_index: Factory) -> None:
    index = make_index()
    report = await index.apply_batches(
        [batch("a", 1, X(), S(H[:4]), S(H[4:6], tier=1), epoch=7), batch("b", 1, X(), S(H[:2])), batch("a", 1, X())]
    )
    assert report.applied + report.stale == 8
    stats = await index.block_stats()
    a, b = stats.backends["a"], stats.backends["b"]
    # the third batch is of an older epoch: stale
    assert (a.gpu_blocks, a.storage_blocks, a.source_epoch, a.batches, a.stale_batches) == (4, 2, 7, 1, 1)
    assert (a.applied, a.stale, a.clears) == (6, 0, 1)
    assert (b.gpu_blocks, b.storage_blocks, b.source_epoch) == (2, 0, 1)
    assert a.last_batch_age_s is not None and 0 <= a.last_batch_age_s < 5
    assert a.generation == (await match(index, H[:1], "a"))["a"].generation
    assert stats.block_count == 8
    assert await index.cleanup() == 0
    assert await index.clear_blocks() == 8
    assert await match(index, H[:4], "a", "b") == {"a": NO_MATCH, "b": NO_MATCH}
    assert (await index.block_stats()).backends == {}


async def test_out_of_range_seq_is_stale(make_index: Factory) -> None:
    index = make_index()
    report = await index.apply_batches([batch("a", MAX_SEQ, X(), S(H[:3]))])
    assert (report.batches, report.stale_batches, report.stale) == (0, 1, 3)
    assert await counts(index, H[:3], "a") == {"a": (0, 0, 0)}


async def test_big_groups_and_batches_are_applied_whole(make_index: Factory) -> None:
    index = make_index(per_call=500, per_pipeline=1000)  # Redis: several calls and round trips
    rng = random.Random(4)
    chain = [rng.getrandbits(64) for _ in range(5000)]
    batches = [batch("a", 1, X())] + [batch("a", 2 + i, S(chain[i * 300 : (i + 1) * 300])) for i in range(10)]
    report = await index.apply_batches(batches)
    assert (report.batches, report.applied) == (11, 3000)
    assert await counts(index, chain, "a") == {"a": (3000, 3000, 3000)}
    # one batch far over a script call's size: split into parts, counted once, stamps kept
    big = batch("a", 20, S(chain[3000:]), R(chain[:1]), S(chain[3000:3001] + chain[:1]), R(chain[4999:]))
    report = await index.apply_batches([big])
    assert (report.batches, report.applied, report.stale) == (1, 2000 + 1 + 2 + 1, 0)
    assert await counts(index, chain, "a") == {"a": (4999, 4999, 4999)}
    report = await index.apply_batches([batch("a", 5, S(chain[3000:]), epoch=0)])  # stale, in parts
    assert (report.batches, report.stale_batches, report.stale) == (0, 1, 2000)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_any_interleaving_with_duplicates_equals_in_order_delivery(make_index: Factory, seed: int) -> None:
    rng = random.Random(seed)
    hashes = H[:24]
    batches = make_batches(rng, backends=("a", "b", "c"), hashes=hashes, count=400)
    expected = NaiveBlocks()
    expected.apply_in_order(batches)

    index = make_index()
    delivered: list[KvBatch] = batches + rng.sample(batches, len(batches) // 3)
    rng.shuffle(delivered)
    while delivered:
        size = rng.randint(1, 40)
        group, delivered = delivered[:size], delivered[size:]
        await index.apply_batches(group)

    # every single block, and chains in universe order (the leading-run rule)
    chains = [[h] for h in hashes] + [hashes[i : i + 6] for i in range(0, 24, 3)]
    results = await index.match_many([MatchQuery(chain, ("a", "b", "c")) for chain in chains])
    for chain, got in zip(chains, results, strict=True):
        assert without_generation(got) == {b: expected.match(chain, b) for b in ("a", "b", "c")}
    assert sum(m.any_blocks for r in results for m in r.values()) > 0  # something is left to compare


async def test_a_state_started_without_its_epoch_start_reports_a_gap(make_index: Factory) -> None:
    index = make_index(ttl=1.0)
    # Starts with its epoch's AllCleared: the whole history is there.
    report = await index.apply_batches([batch("a", 1, X()), batch("a", 2, S([H[0]]))])
    assert report.gaps == set()
    # Joined mid-epoch (a store that lost its data, a late consumer): history missing, the state
    # is still built from what comes.
    report = await index.apply_batches([batch("b", 7, S([H[1]]))])
    assert report.gaps == {"b"}
    assert (await index.apply_batches([batch("b", 8, S([H[2]]))])).gaps == set()  # known from now on
    # An empty batch (a keepalive) to a backend the index forgot: a gap too.
    await asyncio.sleep(1.3)  # both expire
    report = await index.apply_batches([batch("a", 3), batch("b", 9, R([H[2]]))])
    assert report.gaps == {"a", "b"}
    stats = await index.block_stats()
    assert set(stats.backends) == {"a", "b"}  # listed again at once
