"""The ingress process's one Redis/Valkey client (DESIGN.md §6: one connection pool shared by
the response cache and the KV-index scorer).

`IngressApp` builds a `SharedRedis` from the configuration (or takes the one passed as
`IngressApp(cfg, redis=shared)`), runs it as a component and exposes it as `app.redis`.
Whoever needs Redis reads `shared.client` when it issues a command, or, if it must keep the
client object (a `RedisKvIndex` built on it, say), registers `shared.on_swap.append(callback)`:
a hot reload that changes the connection (url, tls, password, pool, timeouts, cluster) swaps in
a new client, calls every callback with it, and closes the old one after a grace period, once
the commands still running on it have had their deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from continuum_common.config import RouterConfig
from continuum_common.config.router import Redis, ResponseCacheRedis
from continuum_common.errors import ConfigError

if TYPE_CHECKING:
    from continuum_common.redis_client import RedisClient

log = logging.getLogger(__name__)

Connection = Redis | ResponseCacheRedis


def shared_connection(cfg: RouterConfig) -> Connection | None:
    """The connection the process shares: `redis`, else `response_cache.redis`, else the
    seed's defaults when the response cache uses Redis without naming a connection, else None."""
    conn = cfg.redis_connection()
    if conn is not None:
        return conn
    # (A Redis KV index without a connection is refused by config validation.)
    return ResponseCacheRedis() if cfg.response_cache.backend == "redis" else None


def _client_for(conn: Connection | None) -> RedisClient | None:
    """A client for `conn` (make_redis builds the pool; nothing connects until the first
    command). redis-py is imported only when a connection is configured: it is about a tenth of
    a router's start (docs/benchmarks.md, "Start and stop")."""
    if conn is None:
        return None
    from continuum_common.redis_client import make_redis

    return make_redis(conn)


def _grace_s(conn: Connection) -> float:
    """How long an old client stays open after a swap: one full command deadline and a margin."""
    return (conn.connect_timeout_ms + conn.command_timeout_ms) / 1000 + 1.0


class SharedRedis:
    """Holds the process's Redis client (None when nothing is configured to use Redis)."""

    def __init__(self, connection: Connection | None) -> None:
        self.connection = connection
        self.client: RedisClient | None = _client_for(connection)
        self.generation = 1
        # Called with the new client after a reload swapped it (`client` is already the new one).
        self.on_swap: list[Callable[[RedisClient | None], None]] = []
        self._retired: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(cls, cfg: RouterConfig) -> SharedRedis:
        """Raises ConfigError when the password secret cannot be read."""
        return cls(shared_connection(cfg))

    # Component -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Nothing to do: the pool connects lazily, and an unreachable Redis at start must not
        stop the ingress (the response cache falls back)."""

    def reload(self, config: RouterConfig) -> None:
        conn = shared_connection(config)
        if conn == self.connection:
            return
        try:
            client = _client_for(conn)
        except ConfigError as exc:
            log.error("redis: new connection settings rejected, keeping the current client: %s", exc)
            return
        old, old_conn = self.client, self.connection
        self.client, self.connection = client, conn
        self.generation += 1
        log.info("redis: connection settings changed; new client in use (generation %d)", self.generation)
        for notify in self.on_swap:
            try:
                notify(client)
            except Exception:  # one holder's trouble must not keep the others on the old client
                log.exception("redis: a client-swap callback failed")
        if old is not None and old_conn is not None:
            task = asyncio.get_running_loop().create_task(self._close_later(old, _grace_s(old_conn)))
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    @staticmethod
    async def _close_later(client: RedisClient, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
        finally:  # cancelled by aclose(): close it now
            await _close(client)

    async def aclose(self) -> None:
        for task in list(self._retired):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        client, self.client = self.client, None
        if client is not None:
            await _close(client)


async def _close(client: RedisClient) -> None:
    try:
        await client.aclose()
    except Exception as exc:  # closing a pool to a dead server must not fail the shutdown
        log.debug("redis: closing a client failed: %s", type(exc).__name__)
