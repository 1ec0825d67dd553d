"""Indexer apply rate, end to end (`python -m bench.indexer_apply`): a backlog of N normalized
events in JetStream, one `continuum-indexer` process (its real console entry point), a real
redis-server; events/s from the first ack to the last, read from the durable consumer's ack
floor. Target (issue 7): >= 20,000 events/s on one process."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import nats

from bench.indexer_common import consumer_progress, indexer_process, publish_all, servers, workload

TARGET = 20_000.0


async def one_run(events: int, batch: int) -> float:
    stream = workload(events)
    async with servers() as (nats_server, redis_server):
        await publish_all(nats_server.url, stream)
        nc = await nats.connect(nats_server.url)
        try:
            async with indexer_process(nats_server.url, redis_server.url, "--batch", str(batch)):
                first_floor, first_at = 0, 0.0
                while True:
                    floor, left = await consumer_progress(nc)
                    now = time.perf_counter()
                    if not first_at and floor > 0:
                        first_floor, first_at = floor, now
                    if floor >= events and left == 0:
                        return (floor - first_floor) / (now - first_at)
                    await asyncio.sleep(0.02)
        finally:
            await nc.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rates = []
    for run in range(args.repeats):
        rate = await one_run(args.events, args.batch)
        rates.append(rate)
        print(f"run {run + 1}: {rate:,.0f} events/s")
    median = statistics.median(rates)
    verdict = "met" if median >= TARGET else "MISSED"
    print(
        f"indexer apply rate: median {median:,.0f} events/s over {args.repeats} runs of {args.events:,} events "
        f"(batch {args.batch}); target >= {TARGET:,.0f}: {verdict}"
    )


if __name__ == "__main__":
    asyncio.run(main())
