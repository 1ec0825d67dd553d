"""Build the configured KV index (`kv_cache_index.backend`) from the router configuration."""

from __future__ import annotations

from typing import Protocol

from continuum_common.config.router import RouterConfig
from continuum_common.errors import ConfigError
from continuum_common.kvindex.api import KvIndex, KvIndexWriter
from continuum_common.kvindex.memory import InMemoryKvIndex


class KvIndexStore(KvIndex, KvIndexWriter, Protocol):
    """Both faces at once: what the factory returns."""


def open_kv_index(cfg: RouterConfig) -> KvIndexStore:
    """An InMemoryKvIndex for `backend: memory`, else a RedisKvIndex on the shared Redis
    connection (`redis`, or the seed's `response_cache.redis`). The index owns that client."""
    section = cfg.kv_cache_index
    if section.backend == "memory":
        return InMemoryKvIndex.from_config(section)
    connection = cfg.redis_connection()
    if connection is None:
        raise ConfigError("kv_cache_index.backend is redis but no redis connection is configured")
    from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
    from continuum_common.redis_client import make_redis

    index = RedisKvIndex.from_config(section, make_redis(connection))
    index.owns_client = True
    return index
