"""Tier 4 in the ingress: the KV overlap scorer, the index it reads, its admin routes.

    kv = build_kv_routing(config, registry, link=nats_link, redis=shared_redis)  # None when disabled
    IngressApp(..., scorer=kv.scorer, components=[kv], extra_admin_routes=kv.admin_routes())

IngressApp does exactly this itself when it is not given a scorer (docs/kv-scorer.md).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig
from continuum_ingress.adapters.nats_link import NatsLink
from continuum_ingress.adapters.shared_redis import SharedRedis
from continuum_ingress.kv.component import KvRouting
from continuum_ingress.kv.scorer import KvOverlapScorer
from continuum_ingress.kv.speculative import SpeculativeEntries

__all__ = ["KvOverlapScorer", "KvRouting", "SpeculativeEntries", "build_kv_routing"]


def build_kv_routing(
    config: RouterConfig,
    registry: CollectorRegistry,
    *,
    link: NatsLink,
    redis: SharedRedis | None = None,
) -> KvRouting | None:
    """Tier 4 for this configuration, or None when `kv_cache_index.enabled` is false."""
    if not config.kv_cache_index.enabled:
        return None
    return KvRouting(config, registry, link=link, redis=redis)
