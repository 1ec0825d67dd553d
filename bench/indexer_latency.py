"""Event-to-routable latency (`python -m bench.indexer_latency`): the time from publishing one
normalized event to JetStream until `RedisKvIndex.query_backends()` (the read the ingress
scorer makes) returns its backend. One `continuum-indexer` process, real nats-server and
redis-server; probes are sent one at a time (each for a prefix never seen before) while a
background publisher adds load at the given rates. Target (issue 7): p99 <= 100 ms."""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import nats
import redis.asyncio as aioredis

from bench.indexer_common import indexer_process, prefix, servers, workload
from continuum_common.events import EventType, KvEvent
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex

TARGET_P99_MS = 100.0


async def background(nats_url: str, rate: int, stop: asyncio.Event) -> int:
    """Publish `rate` events/s in 10 ms slices until stopped; return how many were sent."""
    if rate <= 0:
        await stop.wait()
        return 0
    events = workload(max(rate * 60, 1000), seed=9)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sent, start = 0, time.perf_counter()
    try:
        while not stop.is_set():
            due = int((time.perf_counter() - start) * rate)
            pending = []
            while sent < due:
                event = events[sent % len(events)]
                pending.append(await js.publish_async(event.subject, event.encode()))
                sent += 1
            if pending:
                await asyncio.gather(*pending)
            await asyncio.sleep(0.01)
    finally:
        await nc.close()
    return sent


async def probe(nats_url: str, index: RedisKvIndex, count: int, first: int) -> list[float]:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    latencies = []
    try:
        for i in range(first, first + count):
            p = prefix(10_000_000 + i)
            event = KvEvent("probe", 1, i + 1, time.time(), EventType.CREATED, p, 512)
            started = time.perf_counter()
            await js.publish(event.subject, event.encode())
            while not await index.query_backends(p):  # noqa: ASYNC110 - polling is what is measured
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
    parser.add_argument("--probes", type=int, default=500)
    parser.add_argument("--rates", default="0,5000,10000", help="background events/s, comma separated")
    args = parser.parse_args()
    async with servers() as (nats_server, redis_server):
        index = RedisKvIndex(aioredis.Redis.from_url(redis_server.url), owns_client=True)
        try:
            async with indexer_process(nats_server.url, redis_server.url):
                first = 0
                for rate in (int(r) for r in args.rates.split(",")):
                    stop = asyncio.Event()
                    load = asyncio.create_task(background(nats_server.url, rate, stop))
                    await asyncio.sleep(1.0)  # let the load reach its rate
                    began = time.perf_counter()
                    lat = await probe(nats_server.url, index, args.probes, first)
                    stop.set()
                    sent = await load
                    first += args.probes
                    achieved = sent / (time.perf_counter() - began + 1.0) if rate else 0
                    p99 = percentile(lat, 99)
                    verdict = "met" if p99 <= TARGET_P99_MS else "MISSED"
                    print(
                        f"background {rate:>6}/s (achieved {achieved:,.0f}/s): p50 {statistics.median(lat):.1f} ms  "
                        f"p90 {percentile(lat, 90):.1f} ms  p99 {p99:.1f} ms  max {max(lat):.1f} ms  "
                        f"({len(lat)} probes); target p99 <= {TARGET_P99_MS:.0f} ms: {verdict}"
                    )
        finally:
            await index.close()


if __name__ == "__main__":
    asyncio.run(main())
