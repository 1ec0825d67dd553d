"""The response cache's wiring pieces that need no server: which Redis connection the process
shares, and how the shared client is swapped by a reload (clients are built, never connected)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from continuum_common.config.router import Redis, ResponseCacheRedis
from continuum_ingress.adapters.shared_redis import SharedRedis, shared_connection
from continuum_ingress.cache.hook import ROUTES, CacheHook
from continuum_ingress.protocol.apis import Api
from continuum_testing.ingress_harness import router_config


def test_shared_connection_sources() -> None:
    assert shared_connection(router_config({})) is None
    assert shared_connection(router_config({"response_cache": {"enabled": True}})) is None
    # A Redis backend without a connection section uses the seed's defaults.
    assert shared_connection(router_config({"response_cache": {"backend": "redis"}})) == ResponseCacheRedis()
    seed_style = router_config({"response_cache": {"backend": "redis", "redis": {"url": "redis://cache:6379"}}})
    assert shared_connection(seed_style) == ResponseCacheRedis(url="redis://cache:6379")
    # The top-level `redis` section wins over the seed's `response_cache.redis`.
    both = router_config({"redis": {"url": "redis://shared:6379"}, "response_cache": {"redis": {"url": "redis://x:1"}}})
    assert shared_connection(both) == Redis(url="redis://shared:6379")


async def test_reload_swaps_the_client_only_when_the_connection_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"response_cache": {"enabled": True, "backend": "redis"}}
    shared = SharedRedis.from_config(router_config({**base, "redis": {"url": "redis://127.0.0.1:1"}}))
    first = shared.client
    assert first is not None and shared.generation == 1
    shared.reload(router_config({**base, "redis": {"url": "redis://127.0.0.1:1"}}))
    assert shared.client is first and shared.generation == 1

    cache = CacheHook.from_config(
        router_config({**base, "redis": {"url": "redis://127.0.0.1:1"}}), registry=CollectorRegistry(), redis=shared
    )
    swapped: list[object] = []
    shared.on_swap.append(swapped.append)
    new_cfg = router_config({**base, "redis": {"url": "redis://127.0.0.1:2", "pool_size": 4}})
    shared.reload(new_cfg)
    second = shared.client
    assert second is not None and second is not first and shared.generation == 2
    assert swapped == [second]
    cache.reload(new_cfg)  # the cache's Redis store now uses the new client
    primary = cache.cache.cache_store.primary  # type: ignore[attr-defined]
    assert primary.client is second

    # A password that cannot be read keeps the current client.
    monkeypatch.delenv("CONTINUUM_TEST_NO_SUCH_SECRET", raising=False)
    shared.reload(
        router_config(
            {**base, "redis": {"url": "redis://127.0.0.1:3", "password_env": "CONTINUUM_TEST_NO_SUCH_SECRET"}}
        )
    )
    assert shared.client is second and shared.generation == 2
    await cache.aclose()
    await shared.aclose()
    assert shared.client is None


def test_cached_routes() -> None:
    assert set(ROUTES) == {Api.CHAT, Api.COMPLETIONS, Api.MESSAGES, Api.RESPONSES}  # embeddings: never
