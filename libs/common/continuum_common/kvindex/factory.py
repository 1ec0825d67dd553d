"""Build the configured KV indexes (`kv_cache_index.backend`) from the router configuration:
the prefix-key index (`open_kv_index`) and the block index (`open_block_index`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from continuum_common.config.router import RouterConfig
from continuum_common.errors import ConfigError
from continuum_common.kvindex.api import KvIndex, KvIndexWriter
from continuum_common.kvindex.block_memory import InMemoryBlockIndex
from continuum_common.kvindex.blocks import BlockIndexReader, BlockIndexWriter
from continuum_common.kvindex.memory import InMemoryKvIndex

if TYPE_CHECKING:  # redis-py is imported only where Redis is configured: it is a tenth of a start
    from continuum_common.redis_client import RedisClient


class KvIndexStore(KvIndex, KvIndexWriter, Protocol):
    """Both faces at once: what the factory returns."""


class BlockIndexStore(BlockIndexReader, BlockIndexWriter, Protocol):
    """Both faces of the block index, and closing it."""

    async def close(self) -> None: ...


def _client(cfg: RouterConfig) -> RedisClient:
    connection = cfg.redis_connection()
    if connection is None:
        raise ConfigError("kv_cache_index.backend is redis but no redis connection is configured")
    from continuum_common.redis_client import make_redis

    return make_redis(connection)


def open_kv_index(cfg: RouterConfig, client: RedisClient | None = None) -> KvIndexStore:
    """An InMemoryKvIndex for `backend: memory`, else a RedisKvIndex on `client`, or (without
    one) on a connection of its own to the configured Redis (`redis`, or the seed's
    `response_cache.redis`), which the index then owns and closes."""
    section = cfg.kv_cache_index
    if section.backend == "memory":
        return InMemoryKvIndex.from_config(section)
    from continuum_common.kvindex.adapters.redis_index import RedisKvIndex

    index = RedisKvIndex.from_config(section, client if client is not None else _client(cfg))
    index.owns_client = client is None
    return index


def open_block_index(cfg: RouterConfig, client: RedisClient | None = None) -> BlockIndexStore:
    """An InMemoryBlockIndex for `backend: memory`, else a RedisBlockIndex on `client` (the
    caller's: the ingress passes its shared one) or on a connection of its own, which the
    index then owns and closes."""
    section = cfg.kv_cache_index
    if section.backend == "memory":
        return InMemoryBlockIndex.from_config(section)
    from continuum_common.kvindex.adapters.redis_blocks import RedisBlockIndex

    index = RedisBlockIndex.from_config(section, client if client is not None else _client(cfg))
    index.owns_client = client is None
    return index
