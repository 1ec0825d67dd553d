"""The ingress KV scorer's cost (`python -m continuum_bench.kv_scorer`).

* `score()`: 1,000 calls after one prepare() (seed: 1,000 scoring calls < 100 ms in total), and
  a whole scoring pass (`best_scored` over 4 candidates, what the pipeline does per request);
* `prepare()`: served from the 100 ms cache; with an index read (cache expired) on the memory
  index and on a real redis-server; and 64 concurrent prepares of distinct prefixes, which the
  scorer coalesces into one pipelined `query_many`.

Index: 100,000 prefixes x 3 holders out of 8 backends (the same shape as continuum_bench.indexer_query).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from continuum_bench.indexer_common import prefix
from continuum_bench.indexer_query import events
from continuum_common.kvindex import InMemoryKvIndex, KvIndex
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import RedisServer
from continuum_ingress.kv.scorer import KvOverlapScorer
from continuum_ingress.kv.speculative import SpeculativeEntries
from continuum_ingress.policy.kv_scoring import Weights
from continuum_ingress.policy.scorer import best_scored


@dataclass
class Cand:
    name: str
    in_flight: int = 0
    success_rate: float = 1.0
    weight: int = 1
    latency: float | None = None


CANDIDATES = [Cand(f"vllm-{i}", in_flight=i) for i in range(8)]


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _median_of(runs: int, body: Callable[[], float]) -> float:
    return statistics.median(body() for _ in range(runs))


async def score_calls(index: KvIndex, prefixes: int) -> None:
    scorer = KvOverlapScorer(Weights(), speculative=SpeculativeEntries(2.0), index=index)
    key = bytes.fromhex(prefix(7))
    await scorer.prepare(key, CANDIDATES)
    names = [c.name for c in CANDIDATES]

    def thousand() -> float:
        started = time.perf_counter()
        for i in range(1000):
            scorer.score(key, names[i & 7])
        return (time.perf_counter() - started) * 1000

    def passes() -> float:
        started = time.perf_counter()
        for _ in range(1000):
            best_scored(scorer, key, CANDIDATES[:4])
        return (time.perf_counter() - started) * 1000

    print(f"1,000 score() calls: median {_median_of(9, thousand):.3f} ms total (seed target < 100 ms)")
    print(f"1,000 scoring passes (best_scored over 4 candidates): median {_median_of(9, passes):.3f} ms total")


async def prepare_costs(index: KvIndex, prefixes: int, label: str, number: int) -> None:
    clock = ManualClock()
    scorer = KvOverlapScorer(Weights(), speculative=SpeculativeEntries(2.0), index=index, clock=clock)
    keys = [bytes.fromhex(prefix(i)) for i in range(0, prefixes, max(1, prefixes // number))][:number]
    await scorer.prepare(keys[0], CANDIDATES)
    cached = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(number):
            await scorer.prepare(keys[0], CANDIDATES)
        cached.append((time.perf_counter() - started) / number * 1e6)
    reads = []
    for key in keys:
        clock.t += 1.0  # every prepare finds its entry expired: one index read each
        started = time.perf_counter()
        await scorer.prepare(key, CANDIDATES)
        reads.append((time.perf_counter() - started) * 1e6)
    reads.sort()
    burst = []
    for round_ in range(20):
        clock.t += 1.0
        batch = keys[(round_ * 64) % len(keys) :][:64]
        started = time.perf_counter()
        await asyncio.gather(*(scorer.prepare(k, CANDIDATES) for k in batch))
        burst.append((time.perf_counter() - started) * 1e6)

    def p(q: float) -> float:
        return reads[min(len(reads) - 1, int(q * len(reads)))]

    print(f"{label}: prepare() from the 100 ms cache: median {statistics.median(cached):.1f} µs")
    print(f"{label}: prepare() with an index read: p50 {p(0.5):.1f} µs, p99 {p(0.99):.1f} µs ({len(reads)} reads)")
    print(
        f"{label}: 64 concurrent prepare() of distinct prefixes: median {statistics.median(burst):.0f} µs for all 64 "
        f"({scorer.counters.queries} index reads for {scorer.counters.lookups} prefixes in total)"
    )


async def main(prefixes: int, number: int) -> None:
    memory = InMemoryKvIndex(max_entries=prefixes)
    stream = events(prefixes)
    for start in range(0, len(stream), 5000):
        await memory.apply_batch(stream[start : start + 5000])
    await score_calls(memory, prefixes)
    await prepare_costs(memory, prefixes, "memory", number)
    server = RedisServer()
    await server.start()
    redis_index = RedisKvIndex(aioredis.Redis.from_url(server.url), max_entries=prefixes * 2, owns_client=True)
    try:
        for start in range(0, len(stream), 2000):
            await redis_index.apply_batch(stream[start : start + 2000])
        await prepare_costs(redis_index, prefixes, "redis", number)
    finally:
        await redis_index.close()
        await server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefixes", type=int, default=100_000)
    parser.add_argument("--number", type=int, default=2000, help="prepare() calls per measurement")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(args.prefixes, args.number))
