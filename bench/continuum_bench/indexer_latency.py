"""Event-to-routable latency (`python -m continuum_bench.indexer_latency [--blocks]`): the time from
publishing to JetStream until the read the ingress makes sees it. One `continuum-indexer`
process, real nats-server and redis-server; probes are sent one at a time (each for a prefix
or block never seen before) while a background publisher adds load at the given rates.

* default: a version-1 event, read with `RedisKvIndex.query_backends()`; background load in
  events/s. Target: p99 <= 100 ms.
* `--blocks`: a version-2 batch storing one new block, read with
  `RedisBlockIndex.match_many()`; background load of vLLM-shaped batches in block events/s.
  Target: p99 <= 50 ms at 20,000 block events/s."""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable

import nats
import redis.asyncio as aioredis

from continuum_bench.indexer_common import block_workload, indexer_process, prefix, servers, workload
from continuum_common.events import SUBJECT_PREFIX, EventType, KvEvent
from continuum_common.kvindex import MatchQuery
from continuum_common.kvindex.adapters.redis_blocks import RedisBlockIndex
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.wire.kv import BlocksStored, KvBatch, encode_batch

TARGET_P99_MS = 100.0
TARGET_BLOCKS_P99_MS = 50.0

Message = tuple[str, bytes, int]  # subject, payload, events it carries


def load_messages(rate: int, blocks: bool, seconds: float = 40.0) -> list[Message]:
    """Pre-encoded background messages for `seconds` at `rate` (encoding is not what is measured)."""
    count = max(int(rate * seconds), 1000)
    if blocks:
        return [(SUBJECT_PREFIX + b.backend, encode_batch(b), b.block_count) for b in block_workload(count, seed=9)]
    return [(e.subject, e.encode(), 1) for e in workload(count, seed=9)]


async def background(nats_url: str, rate: int, messages: list[Message], stop: asyncio.Event) -> int:
    """Publish `rate` events/s in 10 ms slices until stopped; return how many events were sent."""
    if rate <= 0:
        await stop.wait()
        return 0
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sent, i, start = 0, 0, time.perf_counter()
    try:
        while not stop.is_set():
            due = int((time.perf_counter() - start) * rate)
            pending = []
            while sent < due and i < len(messages):
                subject, payload, events = messages[i]
                pending.append(await js.publish_async(subject, payload))
                sent += events
                i += 1
            if pending:
                await asyncio.gather(*pending)
            await asyncio.sleep(0.01)
    finally:
        await nc.close()
    return sent


Probe = Callable[[int], tuple[str, bytes, Callable[[], Awaitable[bool]]]]


def event_probe(index: RedisKvIndex) -> Probe:
    def make(i: int) -> tuple[str, bytes, Callable[[], Awaitable[bool]]]:
        p = prefix(10_000_000 + i)
        event = KvEvent("probe", 1, i + 1, time.time(), EventType.CREATED, p, 512)

        async def visible() -> bool:
            return bool(await index.query_backends(p))

        return event.subject, event.encode(), visible

    return make


def block_probe(index: RedisBlockIndex) -> Probe:
    rng = random.Random(77)

    def make(i: int) -> tuple[str, bytes, Callable[[], Awaitable[bool]]]:
        block = rng.getrandbits(64)
        batch = KvBatch("probe", 1, i + 1, time.time(), [BlocksStored([block])])

        async def visible() -> bool:
            (got,) = await index.match_many([MatchQuery([block], ["probe"])])
            return got["probe"].gpu_blocks == 1

        return SUBJECT_PREFIX + "probe", encode_batch(batch), visible

    return make


async def probe(nats_url: str, make: Probe, count: int, first: int) -> list[float]:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    latencies = []
    try:
        for i in range(first, first + count):
            subject, payload, visible = make(i)
            started = time.perf_counter()
            await js.publish(subject, payload)
            while not await visible():  # noqa: ASYNC110 - polling is what is measured
                await asyncio.sleep(0.0002)
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(random.uniform(0.005, 0.02))
    finally:
        await nc.close()
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", action="store_true", help="version-2 batches and the block index")
    parser.add_argument("--probes", type=int, default=500)
    parser.add_argument("--rates", default=None, help="background events/s, comma separated")
    args = parser.parse_args()
    rates = [int(r) for r in (args.rates or ("0,10000,20000,40000" if args.blocks else "0,5000,10000")).split(",")]
    target = TARGET_BLOCKS_P99_MS if args.blocks else TARGET_P99_MS
    unit = "block events" if args.blocks else "events"
    async with servers() as (nats_server, redis_server):
        client = aioredis.Redis.from_url(redis_server.url)
        make = block_probe(RedisBlockIndex(client)) if args.blocks else event_probe(RedisKvIndex(client))
        try:
            async with indexer_process(nats_server.url, redis_server.url):
                first = 0
                for rate in rates:
                    messages = load_messages(rate, args.blocks)
                    stop = asyncio.Event()
                    load = asyncio.create_task(background(nats_server.url, rate, messages, stop))
                    await asyncio.sleep(1.0)  # let the load reach its rate
                    began = time.perf_counter()
                    lat = await probe(nats_server.url, make, args.probes, first)
                    stop.set()
                    sent = await load
                    first += args.probes
                    achieved = sent / (time.perf_counter() - began + 1.0) if rate else 0
                    p99 = percentile(lat, 99)
                    verdict = "met" if p99 <= target else "MISSED"
                    print(
                        f"background {rate:>6} {unit}/s (achieved {achieved:,.0f}/s): p50 {statistics.median(lat):.1f} ms  "
                        f"p90 {percentile(lat, 90):.1f} ms  p99 {p99:.1f} ms  max {max(lat):.1f} ms  "
                        f"({len(lat)} probes); target p99 <= {target:.0f} ms: {verdict}"
                    )
        finally:
            await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
