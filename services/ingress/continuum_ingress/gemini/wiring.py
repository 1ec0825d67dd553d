"""Builds the ingress's Gemini pieces from the configuration (called by the composition root).

`gemini_context_cache` is a restart-only section, so everything is decided once, at start:

| enabled | prefer_native_api | gemini dialect                 | rewriters, components, metrics |
|---------|-------------------|--------------------------------|--------------------------------|
| false   | false             | compat pass-through            | none                           |
| false   | true              | native conversion              | none                           |
| true    | either            | native or compat + accounting  | the context cache (NATS)       |

With the feature off nothing is allocated for it: no bus use, task, memo or metric; the
admin endpoints answer that it is not enabled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute

from continuum_common.config import RouterConfig
from continuum_ingress.adapters.nats_link import NatsLink
from continuum_ingress.gemini.adapters.bus import GeminiBus
from continuum_ingress.gemini.admin import admin_routes
from continuum_ingress.gemini.context_cache import GeminiContextCache
from continuum_ingress.gemini.dialect import GeminiDialect
from continuum_ingress.gemini.metrics import GeminiMetrics
from continuum_ingress.hooks import BodyRewriter, Component
from continuum_ingress.protocol.dialects import UpstreamDialect


@dataclass(frozen=True)
class GeminiParts:
    dialect: UpstreamDialect
    rewriters: Sequence[BodyRewriter]
    components: Sequence[Component]
    admin_routes: Sequence[BaseRoute]
    cache: GeminiContextCache | None


def build_gemini(config: RouterConfig, registry: CollectorRegistry, *, link: NatsLink | None) -> GeminiParts:
    """`link`: the process's NATS connection (required when the context cache is enabled)."""
    section = config.gemini_context_cache
    if not section.enabled:
        dialect = GeminiDialect(native=section.prefer_native_api, usage=None)
        return GeminiParts(dialect, (), (), admin_routes(None), None)
    metrics = GeminiMetrics(registry)
    assert link is not None  # the app makes one whenever the context cache is enabled
    bus = GeminiBus(config.bus, metrics, link=link, lookup_timeout_s=section.lookup_timeout_ms / 1000)
    cache = GeminiContextCache(section, bus, metrics)
    dialect = GeminiDialect(native=section.prefer_native_api, usage=cache)
    return GeminiParts(dialect, (cache,), (cache,), admin_routes(cache), cache)
