"""Building the `ResponseCache` from the router configuration, and hot-reloading it.

The ingress composition root calls `build_response_cache(cfg, registry=..., redis_client=...)`
once, `start()`s it in its lifespan, `reload(new_cfg)`s it on SIGHUP/file change and
`aclose()`s it on shutdown. Pass the process's shared Redis client (the one the KV index
uses, DESIGN.md §6); without one, a Redis backend builds (and then owns) its own.

Hot reload covers every field but `response_cache.backend` (a backend change needs a
restart, as the seed says; it is logged and ignored). Redis connection fields (url, tls,
pool, timeouts) belong to the shared client: its owner rebuilds it and passes the new client
to `reload(cfg, redis_client=...)`. `key_prefix` and the fallback fields apply at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry

from continuum_common.config.router import Redis, ResponseCacheRedis, RouterConfig
from continuum_common.config.secrets import read_secret
from continuum_ingress.cache.adapters.embeddings import HttpEmbeddingClient
from continuum_ingress.cache.facade import Closable, ResponseCache
from continuum_ingress.cache.fallback import FallbackCacheStore
from continuum_ingress.cache.memory import InMemoryCacheStore
from continuum_ingress.cache.metrics import CacheMetrics
from continuum_ingress.cache.policy.eligibility import CachePolicy
from continuum_ingress.cache.semantic import SemanticLayer, SemanticSettings
from continuum_ingress.cache.store import CacheStore

if TYPE_CHECKING:  # redis-py is imported only with a Redis backend: it is a tenth of a start
    from continuum_common.redis_client import RedisClient

log = logging.getLogger(__name__)

DEFAULT_KEY_PREFIX = "cr:resp:"


def _redis_options(cfg: RouterConfig) -> ResponseCacheRedis:
    """Fallback and key-prefix fields live in `response_cache.redis` (seed); defaults otherwise."""
    return cfg.response_cache.redis or ResponseCacheRedis()


def _deadline(conn: Redis | ResponseCacheRedis) -> float:
    return (conn.connect_timeout_ms + conn.command_timeout_ms) / 1000


def _embedder_signature(cfg: RouterConfig) -> tuple[object, ...] | None:
    sem = cfg.response_cache.semantic
    if not sem.enabled:
        return None
    backend = next((b for b in cfg.backends if b.name == sem.backend), None)
    if backend is None or not backend.enabled:
        return None
    return (backend.url, backend.api_key_env, backend.api_key_file, sem.embedding_model, sem.embedding_timeout_ms)


class _HttpClientHolder:
    """The embedding calls' HTTP client: the one given, else one made on first use (and closed
    with the cache). Lazy, because most deployments never enable the semantic path."""

    def __init__(self, client: httpx.AsyncClient | None) -> None:
        self._client = client
        self._owned: httpx.AsyncClient | None = None

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            # Embedding calls are short and one per eligible miss: a small pool suffices.
            self._client = self._owned = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=32, max_keepalive_connections=8)
            )
        return self._client

    async def aclose(self) -> None:
        if self._owned is not None:
            await self._owned.aclose()


def _build_semantic(cfg: RouterConfig, http: _HttpClientHolder, metrics: CacheMetrics) -> SemanticLayer | None:
    sem = cfg.response_cache.semantic
    signature = _embedder_signature(cfg)
    if signature is None or sem.embedding_model is None:
        if sem.enabled:
            # Visibility rule: `enabled: false` backends are never called (internal: true is fine).
            log.warning("semantic cache: backend %r is missing or disabled; semantic path off", sem.backend)
        return None
    backend = next(b for b in cfg.backends if b.name == sem.backend)
    embedder = HttpEmbeddingClient(
        http.get(),
        backend_url=backend.url,
        model=sem.embedding_model,
        timeout_ms=sem.embedding_timeout_ms,
        api_key=read_secret(backend.api_key_env, backend.api_key_file, what=f"backends[{backend.name}].api_key"),
        metrics=metrics,
    )
    layer = SemanticLayer(embedder, SemanticSettings.from_config(cfg.response_cache))
    layer.signature = signature
    return layer


def build_response_cache(
    cfg: RouterConfig,
    *,
    registry: CollectorRegistry,
    redis_client: RedisClient | None = None,
    http_client: httpx.AsyncClient | None = None,
    monitor_interval_s: float = 30.0,
) -> ResponseCache:
    rc = cfg.response_cache
    metrics = CacheMetrics(registry)
    owned: list[Closable] = []
    store: CacheStore
    if rc.backend == "redis":
        from continuum_common.redis_client import make_redis
        from continuum_ingress.cache.adapters.redis_store import RedisCacheStore

        conn = cfg.redis_connection() or ResponseCacheRedis()
        if redis_client is None:
            redis_client = make_redis(conn)
            owned.append(redis_client)
        opts = _redis_options(cfg)
        primary = RedisCacheStore(
            redis_client, key_prefix=opts.key_prefix, deadline_s=_deadline(conn), capacity=rc.capacity, metrics=metrics
        )
        store = FallbackCacheStore(
            primary,
            fallback_to_memory=opts.fallback_to_memory,
            fallback_capacity=opts.fallback_capacity,
            fallback_ttl_seconds=opts.fallback_ttl_seconds,
            monitor_interval_s=monitor_interval_s,
            metrics=metrics,
        )
    else:
        store = InMemoryCacheStore(rc.capacity)
    http = _HttpClientHolder(http_client)
    owned.append(http)
    cache = ResponseCache(
        store,
        policy=CachePolicy.from_config(rc),
        metrics=metrics,
        backend=rc.backend,
        capacity=rc.capacity,
        semantic=_build_semantic(cfg, http, metrics),
        owned=tuple(owned),
    )
    cache.reloader = lambda c, new_cfg, new_client: _reload(c, new_cfg, new_client, http)
    return cache


def _reload(cache: ResponseCache, cfg: RouterConfig, redis_client: RedisClient | None, http: _HttpClientHolder) -> None:
    rc = cfg.response_cache
    # Build what can fail (a secret that cannot be read) before changing anything.
    signature = _embedder_signature(cfg)
    keep_semantic = cache.semantic is not None and signature is not None and cache.semantic.signature == signature
    semantic = cache.semantic if keep_semantic else _build_semantic(cfg, http, cache.metrics)
    if rc.backend != cache.backend:
        log.warning(
            "response_cache.backend changed from %s to %s: a backend change needs a restart; keeping %s",
            cache.backend,
            rc.backend,
            cache.backend,
        )
    cache.policy = CachePolicy.from_config(rc)
    cache.capacity = rc.capacity
    store = cache.cache_store
    if isinstance(store, InMemoryCacheStore):
        store.resize(rc.capacity)
    elif isinstance(store, FallbackCacheStore):
        opts = _redis_options(cfg)
        store.configure(
            fallback_to_memory=opts.fallback_to_memory,
            fallback_capacity=opts.fallback_capacity,
            fallback_ttl_seconds=opts.fallback_ttl_seconds,
        )
        primary = store.primary
        from continuum_ingress.cache.adapters.redis_store import RedisCacheStore

        if isinstance(primary, RedisCacheStore):
            primary.key_prefix = opts.key_prefix
            primary.capacity = rc.capacity
            conn = cfg.redis_connection()
            if conn is not None:
                primary.deadline_s = _deadline(conn)
            if redis_client is not None:
                primary.replace_client(redis_client)
    if semantic is not None and keep_semantic:
        semantic.configure(SemanticSettings.from_config(rc))
    cache.semantic = semantic
