"""KV index read cost (`python -m continuum_bench.indexer_query [--blocks]`): what the ingress pays per
routing decision.

* default: InMemoryKvIndex.query_backends (seed: < 100 µs) on a full 100,000-prefix index, hit
  and miss; RedisKvIndex.query_many against a real redis-server for 1 and 4 prefixes (one
  pipelined round trip; seed: about one Redis GET, 0.1-2 ms on a LAN).
* `--blocks`: the block index's longest-prefix match of a 750-hash chain (a 12k-token request
  at 16 tokens per block) against 4 and 32 backends, each also holding 20,000 other blocks:
  InMemoryBlockIndex.match_nowait and RedisBlockIndex.match_many (one pipelined round trip,
  one script call per backend), for three holdings: `miss` (nobody holds the first block),
  `partial` (each backend holds a random leading part), `full` (everybody holds all 750).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import redis.asyncio as aioredis

from continuum_bench.indexer_common import prefix
from continuum_common.events import EventType, KvEvent
from continuum_common.kvindex import InMemoryBlockIndex, InMemoryKvIndex, MatchQuery
from continuum_common.kvindex.adapters.redis_blocks import RedisBlockIndex
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import RedisServer
from continuum_common.wire.kv import AllCleared, BlockEvent, BlocksStored, KvBatch


def events(prefixes: int, backends: int = 8) -> list[KvEvent]:
    rng = random.Random(5)
    out: list[KvEvent] = []
    for i in range(prefixes):
        for b in rng.sample(range(backends), 3):
            out.append(
                KvEvent(f"vllm-{b}", 1, len(out) + 1, 0.0, EventType.CREATED, prefix(i), rng.choice((512, 2048)))
            )
    return out


async def memory(prefixes: int, number: int) -> None:
    index = InMemoryKvIndex(max_entries=prefixes)
    stream = events(prefixes)
    for start in range(0, len(stream), 5000):
        await index.apply_batch(stream[start : start + 5000])
    hits = [prefix(i) for i in random.Random(1).sample(range(prefixes), 1000)]
    misses = [prefix(prefixes + i) for i in range(1000)]
    for name, keys in (("hit", hits), ("miss", misses)):
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for n in range(number):
                await index.query_backends(keys[n % 1000])
            runs.append((time.perf_counter() - started) / number * 1e6)
        print(
            f"InMemoryKvIndex.query_backends ({name}, {prefixes:,} prefixes): median {statistics.median(runs):.2f} µs/op"
        )


async def redis_reads(prefixes: int, number: int) -> None:
    server = RedisServer()
    await server.start()
    index = RedisKvIndex(aioredis.Redis.from_url(server.url), max_entries=prefixes * 2, owns_client=True)
    try:
        stream = events(prefixes)
        for start in range(0, len(stream), 2000):
            await index.apply_batch(stream[start : start + 2000])
        rng = random.Random(2)
        for width in (1, 4):
            samples = []
            for _ in range(number):
                keys = [prefix(rng.randrange(prefixes)) for _ in range(width)]
                started = time.perf_counter()
                await index.query_many(keys)
                samples.append((time.perf_counter() - started) * 1e6)
            samples.sort()
            print(
                f"RedisKvIndex.query_many ({width} prefix{'es' if width > 1 else ''}): "
                f"p50 {samples[len(samples) // 2]:.0f} µs  p99 {samples[int(len(samples) * 0.99)]:.0f} µs"
            )
    finally:
        await index.close()
        await server.close()


CHAIN = 750
SHAPES = ("miss", "partial", "full")


def block_batches(backends: int, shape: str, fill: int, seed: int = 3) -> tuple[list[int], list[KvBatch]]:
    """A chain and the batches that make each backend hold `shape` of it plus `fill` others."""
    rng = random.Random(seed)
    chain = [rng.getrandbits(64) for _ in range(CHAIN)]
    out = []
    for b in range(backends):
        held = {"miss": chain[1:], "partial": chain[: rng.randint(0, CHAIN)], "full": chain}[shape]
        others = [rng.getrandbits(64) for _ in range(fill)]
        events: list[BlockEvent] = [AllCleared(), BlocksStored(others), BlocksStored(held)]
        out.append(KvBatch(f"vllm-{b}", 1, 1, 0.0, events))
    return chain, out


def summary(samples: list[float]) -> str:
    samples.sort()
    return f"p50 {samples[len(samples) // 2]:.0f} µs  p99 {samples[int(len(samples) * 0.99)]:.0f} µs"


async def block_reads(number: int, fill: int) -> None:
    server = RedisServer()
    await server.start()
    try:
        for backends in (4, 32):
            names = [f"vllm-{b}" for b in range(backends)]
            for shape in SHAPES:
                chain, batches = block_batches(backends, shape, fill)
                memory_index = InMemoryBlockIndex(max_blocks=fill + CHAIN)
                memory_index.apply_nowait(batches)
                runs = []
                for _ in range(5):
                    started = time.perf_counter()
                    for _ in range(number):
                        memory_index.match_nowait(chain, names)
                    runs.append((time.perf_counter() - started) / number * 1e6)
                client = aioredis.Redis.from_url(server.url)
                await client.flushall()
                index = RedisBlockIndex(client, max_blocks=fill + CHAIN, owns_client=True)
                try:
                    await index.apply_batches(batches)
                    query = [MatchQuery(chain, names)]
                    for _ in range(50):
                        await index.match_many(query)
                    samples = []
                    for _ in range(min(number, 500)):
                        started = time.perf_counter()
                        await index.match_many(query)
                        samples.append((time.perf_counter() - started) * 1e6)
                finally:
                    await index.close()
                print(
                    f"{CHAIN}-hash chain x {backends:>2} backends, {shape:<7}: "
                    f"InMemoryBlockIndex.match_nowait median {statistics.median(runs):.0f} µs; "
                    f"RedisBlockIndex.match_many {summary(samples)}"
                )
    finally:
        await server.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", action="store_true", help="the block index's chain match")
    parser.add_argument("--prefixes", type=int, default=100_000)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--fill", type=int, default=20_000, help="--blocks: other blocks each backend holds")
    args = parser.parse_args()
    if args.blocks:
        await block_reads(min(args.number, 1000), args.fill)
        return
    await memory(args.prefixes, args.number)
    await redis_reads(min(args.prefixes, 20_000), min(args.number, 5000))


if __name__ == "__main__":
    asyncio.run(main())
