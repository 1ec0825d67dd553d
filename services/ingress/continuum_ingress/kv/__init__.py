"""Tier 4 in the ingress: the KV overlap scorer, the index it reads, its admin routes.

    kv = build_kv_routing(config, registry, link=nats_link, redis=shared_redis, embedded_index=factory)
    # None when disabled; `embedded_index` builds the index of `backend: memory` (kv/embedded.py)
    IngressApp(..., scorer=kv.scorer, components=[kv], extra_admin_routes=kv_admin_routes(kv))

IngressApp does exactly this itself when it is not given a scorer (docs/kv-scorer.md).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from starlette.routing import Route

from continuum_common.config import RouterConfig
from continuum_ingress.adapters.nats_link import NatsLink
from continuum_ingress.kv.admin import KvAdminEndpoints
from continuum_ingress.kv.component import KvRouting
from continuum_ingress.kv.embedded import EmbeddedIndex, EmbeddedIndexFactory
from continuum_ingress.kv.scorer import KvOverlapScorer
from continuum_ingress.kv.speculative import SpeculativeEntries
from continuum_ingress.shared_client import SharedClient

__all__ = [
    "EmbeddedIndex",
    "EmbeddedIndexFactory",
    "KvOverlapScorer",
    "KvRouting",
    "SpeculativeEntries",
    "build_kv_routing",
    "kv_admin_routes",
]


def build_kv_routing(
    config: RouterConfig,
    registry: CollectorRegistry,
    *,
    link: NatsLink,
    redis: SharedClient | None = None,
    embedded_index: EmbeddedIndexFactory | None = None,
) -> KvRouting | None:
    """Tier 4 for this configuration, or None when `kv_cache_index.enabled` is false."""
    if not config.kv_cache_index.enabled:
        return None
    return KvRouting(config, registry, link=link, redis=redis, embedded_index=embedded_index)


def kv_admin_routes(kv: KvRouting) -> list[Route]:
    """`GET /admin/kv-index/stats`, `GET /admin/kv-index/backends`, `POST /admin/kv-index/clear`
    (mounted under /admin, behind the admin token)."""
    return KvAdminEndpoints(kv).routes()
