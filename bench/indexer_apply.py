"""Indexer apply rate, end to end (`python -m bench.indexer_apply`): a backlog of N normalized
events in JetStream, one `continuum-indexer` process (its real console entry point), a real
redis-server; events/s from the first ack to the last, read from the durable consumer's ack
floor. Target (issue 7): >= 20,000 events/s on one process.

Also printed: CPU µs per event of the indexer process, redis-server and nats-server over the
same interval, so figures from a busy machine can be read against what each part costs."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import nats

from bench.indexer_common import (
    consumer_progress,
    cpu_seconds,
    indexer_process,
    publish_all,
    server_pid,
    servers,
    workload,
)

TARGET = 20_000.0


async def one_run(events: int, batch: int, concurrency: int) -> tuple[float, dict[str, float]]:
    stream = workload(events)
    async with servers() as (nats_server, redis_server):
        await publish_all(nats_server.url, stream)
        nc = await nats.connect(nats_server.url)
        flags = ("--batch", str(batch), "--concurrency", str(concurrency))
        try:
            async with indexer_process(nats_server.url, redis_server.url, *flags) as proc:
                pids = {"indexer": proc.pid, "redis": server_pid(redis_server), "nats": server_pid(nats_server)}
                first_floor, first_at, cpu0 = 0, 0.0, {}
                while True:
                    floor, left = await consumer_progress(nc)
                    now = time.perf_counter()
                    if not first_at and floor > 0:
                        first_floor, first_at = floor, now
                        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    if floor >= events and left == 0:
                        done = floor - first_floor
                        cpu = {name: (cpu_seconds(pid) - cpu0[name]) / done * 1e6 for name, pid in pids.items()}
                        return done / (now - first_at), cpu
                    await asyncio.sleep(0.01)
        finally:
            await nc.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rates = []
    for run in range(args.repeats):
        rate, cpu = await one_run(args.events, args.batch, args.concurrency)
        rates.append(rate)
        costs = ", ".join(f"{name} {us:.1f}" for name, us in cpu.items())
        print(f"run {run + 1}: {rate:,.0f} events/s; CPU µs/event: {costs}")
    median = statistics.median(rates)
    verdict = "met" if median >= TARGET else "MISSED"
    print(
        f"indexer apply rate: median {median:,.0f} events/s over {args.repeats} runs of {args.events:,} events "
        f"(batch {args.batch}, concurrency {args.concurrency}); target >= {TARGET:,.0f}: {verdict}"
    )


if __name__ == "__main__":
    asyncio.run(main())
