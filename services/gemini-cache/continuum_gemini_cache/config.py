"""What the service takes from the router configuration file, resolved once at start:
`gemini_context_cache`, the `type: gemini` backends with their API keys (env or file), `redis`
and `bus`. Service-only knobs (queue bounds, concurrency) live in `Limits`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from continuum_common.config.router import GeminiContextCacheConfig, RouterConfig
from continuum_common.config.secrets import read_secret
from continuum_common.gemini_api import api_root
from continuum_gemini_cache.errors import DisabledError

log = logging.getLogger("continuum.gemini_cache")

DISABLED_MESSAGE = (
    "gemini_context_cache.enabled is false in {source}: the gemini-cache service has nothing to do "
    "and refuses to start (set gemini_context_cache.enabled: true to run it)"
)


@dataclass(frozen=True, slots=True)
class GeminiBackend:
    name: str
    url: str
    api_root: str
    api_key: str | None = field(repr=False)  # never printed, never logged
    connect_timeout_s: float
    request_timeout_s: float
    max_connections: int


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of the service's own queues and concurrency (every queue is bounded; overflow is
    a counted drop)."""

    ensure_queue: int = 1024  # pending distinct creates per replica
    create_workers: int = 8
    maintenance_queue: int = 4096  # pending DELETE / PATCH jobs
    maintenance_workers: int = 4
    concurrent_requests: int = 512  # lookups/drops/admin handled at once per replica
    maintenance_timeout_s: float = 10.0  # deadline of one PATCH or DELETE
    lock_margin_ms: int = 3000  # create lock lifetime = create_timeout_ms + this
    extend_lock_ms: int = 30_000  # after a failed PATCH, no retry on this entry for this long
    live_margin_s: float = 5.0  # an entry this close to expiry is no longer handed out
    counter_flush_s: float = 1.0
    sweep_interval_s: float = 30.0
    sweep_batch: int = 1000


@dataclass(frozen=True, slots=True)
class Settings:
    cache: GeminiContextCacheConfig
    backends: dict[str, GeminiBackend]
    limits: Limits = Limits()

    @property
    def ttl_seconds(self) -> float:
        return self.cache.ttl


def resolve(cfg: RouterConfig, *, source: str = "config", limits: Limits | None = None) -> Settings:
    """Settings from a loaded router config. Raises DisabledError when the feature is off and
    SecretError when a named API key cannot be read."""
    if not cfg.gemini_context_cache.enabled:
        raise DisabledError(DISABLED_MESSAGE.format(source=source))
    backends: dict[str, GeminiBackend] = {}
    for i, b in enumerate(cfg.backends):
        if b.type != "gemini" or not b.enabled:
            continue
        key = read_secret(b.api_key_env, b.api_key_file, what=f"backends[{i}].api_key")
        if key is None:
            log.warning("backend %s (type gemini) has no api_key_env/api_key_file: calls go unauthenticated", b.name)
        backends[b.name] = GeminiBackend(
            name=b.name,
            url=b.url,
            api_root=api_root(b.url),
            api_key=key,
            connect_timeout_s=b.connect_timeout_ms / 1000,
            request_timeout_s=min(b.request_timeout_ms / 1000, 60.0),
            max_connections=min(b.max_connections, 32),
        )
    if not backends:
        log.warning("gemini_context_cache is enabled but no enabled backend has type: gemini")
    return Settings(cache=cfg.gemini_context_cache, backends=backends, limits=limits or Limits())
