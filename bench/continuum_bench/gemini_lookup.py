"""gemini-cache lookup latency over the real bus (`python -m continuum_bench.gemini_lookup`).

Starts nats-server, redis-server, the fake Gemini API and one gemini-cache service, creates
`--entries` caches, then measures what the ingress pays per eligible request: a NATS
request/reply on `continuum.gemini.lookup` answered from the state store (a Lua script in
Redis, or the memory store). Prints p50/p99/max in ms for sequential lookups and for
`--concurrency` lookups in flight, for both stores. The ingress waits at most
`gemini_context_cache.lookup_timeout_ms` (default 50 ms) and treats a timeout as a miss.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from continuum_common.procs import NatsServer, RedisServer
from continuum_gemini_cache.app import GeminiCacheApp
from continuum_testing.fake_gemini import FakeGemini
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, GeminiBusClient, router_config, system_prompt


def _summary(samples_ms: list[float]) -> str:
    ordered = sorted(samples_ms)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):6.3f} ms  p99 {p99:6.3f} ms  max {ordered[-1]:6.3f} ms"


async def _timed_lookup(bus: GeminiBusClient, system: str) -> float:
    start = time.perf_counter()
    reply = await bus.lookup(system)
    elapsed = (time.perf_counter() - start) * 1000
    if not reply.hit:
        raise RuntimeError("expected a hit")
    return elapsed


async def _run_state(state: str, args: argparse.Namespace, nats: NatsServer, redis: RedisServer) -> None:
    async with FakeGemini(api_keys={API_KEY}) as fake:
        cfg = router_config(fake.url, nats.url, redis_url=redis.url if state == "redis" else None)
        app = GeminiCacheApp(cfg)
        await app.start()
        bus = await GeminiBusClient.connect(nats.url)
        try:
            prompts = [system_prompt(i) for i in range(args.entries)]
            for prompt in prompts:
                await bus.ensure(prompt)
            for prompt in prompts[:200]:  # warm-up: connections, script cache
                await _timed_lookup(bus, prompt)
            sequential = [await _timed_lookup(bus, prompts[i % len(prompts)]) for i in range(args.requests)]
            concurrent: list[float] = []
            for i in range(0, args.requests, args.concurrency):
                batch = [prompts[(i + j) % len(prompts)] for j in range(args.concurrency)]
                concurrent.extend(await asyncio.gather(*(_timed_lookup(bus, p) for p in batch)))
            print(f"{state:6s} sequential      {_summary(sequential)}")
            print(f"{state:6s} {args.concurrency:3d} in flight  {_summary(concurrent)}")
        finally:
            await bus.close()
            await app.stop()


async def main(args: argparse.Namespace) -> None:
    os.environ[KEY_ENV] = API_KEY
    nats, redis = NatsServer(), RedisServer()
    await nats.start()
    await redis.start()
    try:
        print(f"gemini-cache lookup latency: {args.requests} lookups over {args.entries} entries")
        for state in ("memory", "redis"):
            await _run_state(state, args, nats, redis)
    finally:
        await nats.close()
        await redis.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default="uvloop", help="the service's default is uvloop"
    )
    parsed = parser.parse_args()
    if parsed.loop == "uvloop":
        import uvloop

        uvloop.run(main(parsed))
    else:
        asyncio.run(main(parsed))
