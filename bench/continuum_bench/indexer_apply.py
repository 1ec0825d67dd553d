"""Indexer apply rate, end to end (`python -m continuum_bench.indexer_apply [--blocks]`): a backlog in
JetStream, one `continuum-indexer` process (its real console entry point), a real
redis-server; the rate from the first ack to the last, read from the durable consumer's ack
floor.

* default: N normalized version-1 events (prefix-key index). Target: >= 20,000
  events/s on one process.
* `--blocks`: version-2 KV batches of about N block events, vLLM-shaped (per batch 1-3 stores
  of 20-200 hashes and, once an engine's cache is full, one single-hash removal per evicted
  block), into the block index. Target: >= 50,000 block events/s.

Also printed: CPU µs per event of the indexer process, redis-server and nats-server over the
same interval, so figures from a busy machine can be read against what each part costs."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

import nats
from nats.aio.client import Client as NatsClient

from continuum_bench.indexer_common import (
    block_events,
    block_workload,
    consumer_progress,
    cpu_seconds,
    indexer_process,
    publish_all,
    publish_batches,
    server_pid,
    servers,
    workload,
)

TARGET = 20_000.0
TARGET_BLOCKS = 50_000.0


async def one_run(events: int, batch: int, concurrency: int, blocks: bool) -> tuple[float, dict[str, float]]:
    async with servers() as (nats_server, redis_server):
        if blocks:
            stream = block_workload(events)
            cumulative = block_events(stream)
            messages = len(stream)
            await publish_batches(nats_server.url, stream)

            def done_by(floor: int) -> int:  # block events in the first `floor` messages
                return cumulative[floor - 1] if floor > 0 else 0
        else:
            messages = events
            await publish_all(nats_server.url, workload(events))

            def done_by(floor: int) -> int:
                return floor

        nc = await nats.connect(nats_server.url)
        flags = ("--batch", str(batch), "--concurrency", str(concurrency))
        try:
            async with indexer_process(nats_server.url, redis_server.url, *flags) as proc:
                pids = {"indexer": proc.pid, "redis": server_pid(redis_server), "nats": server_pid(nats_server)}
                return await _measure(nc, pids, messages, done_by)
        finally:
            await nc.close()


async def _measure(
    nc: NatsClient, pids: dict[str, int], messages: int, done_by: Callable[[int], int]
) -> tuple[float, dict[str, float]]:
    first_floor, first_at, cpu0 = 0, 0.0, {}
    while True:
        floor, left = await consumer_progress(nc)
        now = time.perf_counter()
        if not first_at and floor > 0:
            first_floor, first_at = floor, now
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        if floor >= messages and left == 0:
            done = done_by(floor) - done_by(first_floor)
            cpu = {name: (cpu_seconds(pid) - cpu0[name]) / done * 1e6 for name, pid in pids.items()}
            return done / (now - first_at), cpu
        await asyncio.sleep(0.01)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", action="store_true", help="version-2 block batches into the block index")
    parser.add_argument("--events", type=int, default=None, help="events (default 200,000; 1,000,000 with --blocks)")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    events = args.events or (1_000_000 if args.blocks else 200_000)
    unit, target = ("block events", TARGET_BLOCKS) if args.blocks else ("events", TARGET)
    rates = []
    for run in range(args.repeats):
        rate, cpu = await one_run(events, args.batch, args.concurrency, args.blocks)
        rates.append(rate)
        costs = ", ".join(f"{name} {us:.2f}" for name, us in cpu.items())
        print(f"run {run + 1}: {rate:,.0f} {unit}/s; CPU µs per {unit[:-1]}: {costs}")
    median = statistics.median(rates)
    verdict = "met" if median >= target else "MISSED"
    print(
        f"indexer apply rate: median {median:,.0f} {unit}/s over {args.repeats} runs of {events:,} {unit} "
        f"(batch {args.batch}, concurrency {args.concurrency}); target >= {target:,.0f}: {verdict}"
    )


if __name__ == "__main__":
    asyncio.run(main())
