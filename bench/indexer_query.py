"""KV index read cost (`python -m bench.indexer_query`): what the ingress scorer pays per
routing decision. InMemoryKvIndex.query_backends (seed: < 100 µs) on a full 100,000-prefix
index, hit and miss; RedisKvIndex.query_many against a real redis-server for 1 and 4 prefixes
(one pipelined round trip; seed: about one Redis GET, 0.1-2 ms on a LAN)."""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import redis.asyncio as aioredis

from bench.indexer_common import prefix
from continuum_common.events import EventType, KvEvent
from continuum_common.kvindex import InMemoryKvIndex
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import RedisServer


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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefixes", type=int, default=100_000)
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()
    await memory(args.prefixes, args.number)
    await redis_reads(min(args.prefixes, 20_000), min(args.number, 5000))


if __name__ == "__main__":
    asyncio.run(main())
