"""The shared Redis/Valkey client: one pool per process, built from the `redis` section (or the
seed's `response_cache.redis`). Works with a single node or Redis Cluster.

Pool health: a Redis restart leaves every pooled connection pointing at a socket the old
server closed. Each command therefore gets one immediate retry on a connection error (on a
fresh connection), idle connections PING before reuse (`health_check_interval_ms`), and TCP
keepalive finds peers that vanished without closing. Without these, the first command on each
stale connection failed after Redis had come back, and the response cache fell back to memory
again for a full monitor interval once per stale connection it hit.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from continuum_common.config.router import Redis, RedisConnection
from continuum_common.config.secrets import read_secret

RedisClient = aioredis.Redis | RedisCluster


def retry_once() -> Retry:
    """One immediate retry on a connection error, never on a timeout: a dead peer is retried
    on a new connection at once, while a slow one is not given a second full deadline."""
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def client_options(cfg: RedisConnection) -> dict[str, Any]:
    """Keyword arguments of redis-py connections for `cfg` (secrets read here, never logged)."""
    options: dict[str, Any] = {
        "socket_connect_timeout": cfg.connect_timeout_ms / 1000,
        "socket_timeout": cfg.command_timeout_ms / 1000,
        "socket_keepalive": cfg.socket_keepalive,
        "health_check_interval": cfg.health_check_interval_ms / 1000,
        "username": cfg.username,
        "password": read_secret(cfg.password_env, cfg.password_file, what="redis.password"),
    }
    tls = cfg.tls_files()
    if tls is not None:
        options.update(
            ssl_cert_reqs="required",
            ssl_ca_certs=tls.ca_file,
            ssl_certfile=tls.cert_file,
            ssl_keyfile=tls.key_file,
        )
    return options


def client_url(cfg: RedisConnection) -> str:
    """The url with its scheme turned to `rediss://` when TLS is configured."""
    if cfg.tls_files() is not None and cfg.url.startswith("redis://"):
        return "rediss://" + cfg.url[len("redis://") :]
    return cfg.url


def make_redis(cfg: RedisConnection) -> RedisClient:
    """Build (but do not connect) a client with the configured timeouts, TLS and pool size.
    Raises SecretError when the password secret cannot be read."""
    options = client_options(cfg)
    url = client_url(cfg)
    if isinstance(cfg, Redis) and cfg.cluster:
        # The cluster client has its own retry loop (it refreshes the slot map on a connection
        # error and tries again), so only the per-connection options are passed.
        return RedisCluster.from_url(url, max_connections=cfg.pool_size, **options)
    # A blocking pool: when all `pool_size` connections are busy a command waits (up to the
    # connect timeout) for one instead of failing at once with "Too many connections", which
    # under a burst would look like an outage to every caller sharing the pool.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=cfg.pool_size,
        timeout=cfg.connect_timeout_ms / 1000,
        retry=retry_once(),
        **options,
    )
    return aioredis.Redis.from_pool(pool)
