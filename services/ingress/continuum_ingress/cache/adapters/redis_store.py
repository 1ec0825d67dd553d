"""`RedisCacheStore`: the shared response cache in Redis/Valkey (seed Tier 3).

Keys are `<key_prefix><logical key>`: `cr:resp:<sha256 hex>` for exact entries and
`cr:resp:sem:<id>` for semantic-cache bodies (DESIGN.md §6). Writes are `SET key value EX ttl`,
reads `GET`; both are single-key commands, so they work unchanged on Redis Cluster. The client
is the process's shared one (`continuum_common.redis_client.make_redis`), so its pool, TLS,
password and connect/command timeouts are the ones of the `redis` section; this store adds an
overall deadline on top, because a blocked pool wait plus a slow connect can exceed either
timeout alone.

Every failure becomes a `CacheBackendError` with the seed's error class (connection, timeout,
other); the fallback wrapper decides what to do with it. This module never logs keys' payloads.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster

from continuum_common.redis_client import RedisClient
from continuum_ingress.cache.errors import BackendErrorKind, CacheBackendError
from continuum_ingress.cache.metrics import CacheMetrics
from continuum_ingress.cache.store import CacheStoreStats

T = TypeVar("T")

_SCAN_COUNT = 1000
_BATCH = 500
_GLOB = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def classify(exc: BaseException) -> BackendErrorKind:
    """Map a redis-py / asyncio exception to the seed's error classes."""
    if isinstance(exc, TimeoutError | rexc.TimeoutError):
        return BackendErrorKind.TIMEOUT
    if isinstance(exc, rexc.MaxConnectionsError):
        # A saturated pool is load, not an outage: do not split the cache over it.
        return BackendErrorKind.OTHER
    if isinstance(exc, rexc.ConnectionError) and str(exc).startswith("No connection available"):
        return BackendErrorKind.OTHER  # BlockingConnectionPool wait ran out: same as above
    if isinstance(exc, rexc.ConnectionError | OSError):
        return BackendErrorKind.CONNECTION
    return BackendErrorKind.OTHER


class RedisCacheStore:
    backend = "redis"

    def __init__(
        self,
        client: RedisClient,
        *,
        key_prefix: str = "cr:resp:",
        deadline_s: float = 4.0,
        capacity: int | None = None,
        metrics: CacheMetrics | None = None,
    ) -> None:
        self._client = client
        self.key_prefix = key_prefix
        self.deadline_s = deadline_s
        self.capacity = capacity
        self._metrics = metrics
        self.errors: dict[BackendErrorKind, int] = dict.fromkeys(BackendErrorKind, 0)

    @property
    def client(self) -> RedisClient:
        return self._client

    def replace_client(self, client: RedisClient) -> None:
        """Hot reload of the connection: the owner built a new shared client."""
        self._client = client

    async def _run(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.deadline_s):
                result = await call()
        except (rexc.RedisError, OSError, TimeoutError) as exc:
            kind = classify(exc)
            self.errors[kind] += 1
            if self._metrics is not None:
                self._metrics.redis_errors.inc()
                self._metrics.observe_redis(operation, time.perf_counter() - started)
            raise CacheBackendError(kind, operation, type(exc).__name__) from exc
        if self._metrics is not None:
            self._metrics.observe_redis(operation, time.perf_counter() - started)
        return result

    async def get(self, key: str) -> bytes | None:
        name = self.key_prefix + key
        value: Any = await self._run("get", lambda: self._client.get(name))
        return bytes(value) if value is not None else None

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        name = self.key_prefix + key
        # SET EX takes whole seconds; round up so an entry never outlives less than asked.
        seconds = max(1, math.ceil(ttl))
        await self._run("set", lambda: self._client.set(name, value, ex=seconds))

    async def delete(self, key: str) -> None:
        name = self.key_prefix + key
        await self._run("delete", lambda: self._client.delete(name))

    async def ping(self) -> None:
        await self._run("ping", self._client.ping)

    def _pattern(self) -> str:
        return self.key_prefix.translate(_GLOB) + "*"

    async def _walk(self, operation: str, on_batch: Callable[[list[bytes]], Awaitable[int]]) -> int:
        """SCAN every key under this store's prefix (and no other) and hand them over in
        batches; returns the sum of `on_batch`'s results. SCAN, not KEYS, so a large database
        is never blocked; on a cluster redis-py walks every primary. Deleting while scanning
        is safe: SCAN still returns every key that exists for the whole walk."""
        started = time.perf_counter()
        total = 0
        batch: list[bytes] = []
        try:
            async for name in self._client.scan_iter(match=self._pattern(), count=_SCAN_COUNT):
                batch.append(name)
                if len(batch) >= _BATCH:
                    total += await on_batch(batch)
                    batch = []
            if batch:
                total += await on_batch(batch)
        except (rexc.RedisError, OSError, TimeoutError) as exc:
            kind = classify(exc)
            self.errors[kind] += 1
            if self._metrics is not None:
                self._metrics.redis_errors.inc()
            raise CacheBackendError(kind, operation, type(exc).__name__) from exc
        finally:
            if self._metrics is not None:
                self._metrics.observe_redis(operation, time.perf_counter() - started)
        return total

    async def _unlink(self, names: list[bytes]) -> int:
        # One single-key UNLINK per pipelined command, so no command spans two cluster slots.
        if isinstance(self._client, RedisCluster):
            pipe: Any = self._client.pipeline()
        else:
            pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.unlink(name)
        async with asyncio.timeout(self.deadline_s):
            results: list[Any] = await pipe.execute()
        return sum(int(r) for r in results)

    async def clear(self) -> int:
        """Delete every key under `key_prefix` only; other applications' keys are untouched."""
        return await self._walk("clear", self._unlink)

    async def stats(self) -> CacheStoreStats:
        """Entry count by SCAN of this store's prefix: O(keys in the database), admin use only.
        Redis evicts by its own TTL and memory policy, so evictions and size are not tracked."""

        async def count(names: list[bytes]) -> int:
            return len(names)

        entries = await self._walk("stats", count)
        return CacheStoreStats(backend=self.backend, entries=entries, capacity=self.capacity, size_bytes=0, evictions=0)

    def connections(self) -> dict[str, int] | None:
        """Active/idle connections of the shared pool (None on a cluster client, whose pools
        are per node). Reads redis-py pool internals, hence the defensive getattr."""
        pool = getattr(self._client, "connection_pool", None)
        if pool is None:
            return None
        active = getattr(pool, "_in_use_connections", ())
        idle = getattr(pool, "_available_connections", ())
        return {"active": len(active), "idle": len(idle)}
