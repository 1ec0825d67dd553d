"""Response-cache micro-benchmarks (`python -m continuum_bench.cache_lookup`).

In-process costs (µs/op, best and median of `--repeats` runs of `--number` ops):

* `store_get_sync`      InMemoryCacheStore.get_now() on a hit: the store's own lookup (seed: < 1 µs)
* `store_get_async`     `await InMemoryCacheStore.get()`: the same plus one coroutine
* `store_set_sync`      InMemoryCacheStore.set_now() overwriting an entry
* `cache_key`           response_cache_key() of a ~1 KiB chat body (seed: < 5 µs)
* `lookup_hit_memory`   ResponseCache.lookup() hit with the memory backend: eligibility, tenant
                        digest of the API key, cache key, store get, msgpack decode of a 1 KiB body
* `lookup_bypass`       ResponseCache.lookup() of a temperature-0.7 request (eligibility only)

Redis (a local redis-server started by this script, loopback, one connection in use at a time):
p50/p99/mean in µs of `--redis-ops` sequential RedisCacheStore.get (hit), .set (SET EX, 1 KiB)
and ResponseCache.lookup() hits on the Redis backend.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig, parse
from continuum_common.config.router import Redis
from continuum_common.hashing import response_cache_key
from continuum_common.procs import RedisServer
from continuum_common.redis_client import make_redis
from continuum_ingress.cache import CacheRequest, CacheStatus, InMemoryCacheStore, Route, build_response_cache
from continuum_ingress.cache.adapters.redis_store import RedisCacheStore

HEADERS = {"authorization": "Bearer sk-bench-0123456789abcdef", "content-type": "application/json"}


def _body(i: int = 0) -> dict[str, Any]:
    system = "You are a careful assistant. " * 20  # ~580 bytes
    return {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Question number {i}: " + "what does this mean? " * 15},
        ],
        "temperature": 0,
        "max_tokens": 256,
    }


RESPONSE = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * 800}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 200, "total_tokens": 500},
    }
)


def _per_op(fn: Callable[[], object], number: int, repeats: int) -> list[float]:
    for _ in range(min(number, 2000)):
        fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number * 1e6)
    return runs


async def _per_op_async(fn: Callable[[], Awaitable[object]], number: int, repeats: int) -> list[float]:
    for _ in range(min(number, 2000)):
        await fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            await fn()
        runs.append((time.perf_counter() - start) / number * 1e6)
    return runs


def _row(name: str, runs: list[float], target: float | None) -> None:
    best, median = min(runs), statistics.median(runs)
    verdict = "" if target is None else ("ok" if median < target else "OVER TARGET")
    tgt = f"{target:.1f}" if target is not None else "-"
    print(f"{name:<20} {best:>10.3f} {median:>10.3f} {tgt:>8}  {verdict}")


async def in_process(number: int, repeats: int) -> None:
    store = InMemoryCacheStore(1000)
    for i in range(1000):
        store.set_now(f"{i:064x}", RESPONSE, 300)
    key = f"{500:064x}"
    body = _body()
    cache = build_response_cache(
        parse(RouterConfig, {"response_cache": {"enabled": True, "capacity": 1000}}), registry=CollectorRegistry()
    )
    miss = await cache.lookup(CacheRequest(Route.CHAT, body, HEADERS))
    await cache.store(miss, status=200, headers=HEADERS, body=RESPONSE)
    hit_request = CacheRequest(Route.CHAT, body, HEADERS)
    assert (await cache.lookup(hit_request)).status is CacheStatus.HIT
    hot_request = CacheRequest(Route.CHAT, {**body, "temperature": 0.7}, HEADERS)

    print(f"{'in-process':<20} {'best µs/op':>10} {'median':>10} {'target':>8}  verdict")
    _row("store_get_sync", _per_op(lambda: store.get_now(key), number, repeats), 1.0)
    _row("store_get_async", await _per_op_async(lambda: store.get(key), number, repeats), 1.0)
    _row("store_set_sync", _per_op(lambda: store.set_now(key, RESPONSE, 300), number, repeats), None)
    _row(
        "cache_key", _per_op(lambda: response_cache_key(body, tenant_id="key:0123", route="chat"), number, repeats), 5.0
    )
    _row("lookup_hit_memory", await _per_op_async(lambda: cache.lookup(hit_request), number, repeats), None)
    _row("lookup_bypass", await _per_op_async(lambda: cache.lookup(hot_request), number, repeats), None)
    print(f"(chat body {len(orjson.dumps(body))} bytes, cached response {len(RESPONSE)} bytes)")
    await cache.aclose()


def _quantiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return p50, p99, statistics.fmean(ordered)


async def _latencies(fn: Callable[[], Awaitable[object]], ops: int) -> list[float]:
    for _ in range(min(ops, 500)):
        await fn()
    out = []
    for _ in range(ops):
        start = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - start) * 1e6)
    return out


async def redis_latency(ops: int) -> None:
    server = RedisServer()
    await server.start()
    try:
        client = make_redis(Redis(url=server.url))
        store = RedisCacheStore(client)
        key = "b" * 64
        await store.set(key, RESPONSE, 300)
        cfg = parse(
            RouterConfig,
            {"redis": {"url": server.url}, "response_cache": {"enabled": True, "backend": "redis"}},
        )
        cache = build_response_cache(cfg, registry=CollectorRegistry(), redis_client=client)
        request = CacheRequest(Route.CHAT, _body(), HEADERS)
        miss = await cache.lookup(request)
        await cache.store(miss, status=200, headers=HEADERS, body=RESPONSE)
        assert (await cache.lookup(request)).status is CacheStatus.HIT

        print(f"\n{'redis (loopback)':<20} {'p50 µs':>10} {'p99 µs':>10} {'mean µs':>10}")
        for name, fn in (
            ("redis_get_hit", lambda: store.get(key)),
            ("redis_set_ex_1KiB", lambda: store.set(key, RESPONSE, 300)),
            ("lookup_hit_redis", lambda: cache.lookup(request)),
        ):
            p50, p99, mean = _quantiles(await _latencies(fn, ops))
            print(f"{name:<20} {p50:>10.1f} {p99:>10.1f} {mean:>10.1f}")
        print(f"({ops} sequential ops each; seed: Redis GET 0.1-2 ms typical on a LAN, p99 < 5 ms)")
        await client.aclose()
    finally:
        await server.close()


async def _main(args: argparse.Namespace) -> None:
    await in_process(args.number, args.repeats)
    if not args.no_redis:
        await redis_latency(args.redis_ops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--redis-ops", type=int, default=5000)
    parser.add_argument("--no-redis", action="store_true")
    args = parser.parse_args(argv)
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
