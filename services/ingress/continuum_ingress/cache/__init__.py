"""The ingress response cache (seed Tier 2: exact, streaming, semantic; Tier 3: shared Redis
with automatic in-memory fallback). See docs/response-cache.md.

The ingress uses `build_response_cache` and the `ResponseCache` facade; the rest is exported
for tests, benchmarks and other compositions.
"""

from continuum_ingress.cache.errors import (
    BackendErrorKind,
    CacheBackendError,
    CacheError,
    EntryFormatError,
    InvalidateRequestError,
)
from continuum_ingress.cache.facade import CacheLookup, CacheRequest, CacheStatus, ResponseCache, ResponseRecording
from continuum_ingress.cache.factory import build_response_cache
from continuum_ingress.cache.fallback import FallbackCacheStore
from continuum_ingress.cache.memory import InMemoryCacheStore
from continuum_ingress.cache.metrics import CacheMetrics
from continuum_ingress.cache.policy.eligibility import CachePolicy, Route
from continuum_ingress.cache.protocol.entry import CachedResponse, EntryKind
from continuum_ingress.cache.store import CacheStore, CacheStoreStats

__all__ = [
    "BackendErrorKind",
    "CacheBackendError",
    "CacheError",
    "CacheLookup",
    "CacheMetrics",
    "CachePolicy",
    "CacheRequest",
    "CacheStatus",
    "CacheStore",
    "CacheStoreStats",
    "CachedResponse",
    "EntryFormatError",
    "EntryKind",
    "FallbackCacheStore",
    "InMemoryCacheStore",
    "InvalidateRequestError",
    "ResponseCache",
    "ResponseRecording",
    "Route",
    "build_response_cache",
]
