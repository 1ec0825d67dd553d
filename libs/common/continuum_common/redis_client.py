"""The shared Redis/Valkey client: one pool per process, built from the `redis` section (or the
seed's `response_cache.redis`). Works with a single node or Redis Cluster."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from continuum_common.config.router import Redis, ResponseCacheRedis
from continuum_common.config.secrets import read_secret

RedisClient = aioredis.Redis | RedisCluster


def make_redis(cfg: Redis | ResponseCacheRedis) -> RedisClient:
    """Build (but do not connect) a client with the configured timeouts and pool size."""
    options: dict[str, Any] = {
        "socket_connect_timeout": cfg.connect_timeout_ms / 1000,
        "socket_timeout": cfg.command_timeout_ms / 1000,
        "password": read_secret(cfg.password_env, cfg.password_file, what="redis.password"),
    }
    url = cfg.url
    if cfg.tls and url.startswith("redis://"):
        url = "rediss://" + url[len("redis://") :]
    if isinstance(cfg, Redis) and cfg.cluster:
        return RedisCluster.from_url(url, max_connections=cfg.pool_size, **options)
    # A blocking pool: when all `pool_size` connections are busy a command waits (up to the
    # connect timeout) for one instead of failing at once with "Too many connections", which
    # under a burst would look like an outage to every caller sharing the pool.
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=cfg.pool_size, timeout=cfg.connect_timeout_ms / 1000, **options
    )
    return aioredis.Redis.from_pool(pool)
