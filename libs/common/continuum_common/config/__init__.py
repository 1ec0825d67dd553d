"""Configuration schema, loader and validation (DESIGN.md §4)."""

from continuum_common.config.durations import format_duration, parse_duration
from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.config.listener import ListenerConfig, ListenerSource
from continuum_common.config.loader import (
    load_listener_config,
    load_router_config,
    parse,
    read_yaml,
    router_warnings,
)
from continuum_common.config.router import (
    Backend,
    GeminiContextCacheConfig,
    PrefixRouting,
    ResponseAffinity,
    ResponseCacheConfig,
    RouterConfig,
    SelectionStrategy,
)

__all__ = [
    "Backend",
    "GeminiContextCacheConfig",
    "KvCacheIndex",
    "ListenerConfig",
    "ListenerSource",
    "PrefixRouting",
    "ResponseAffinity",
    "ResponseCacheConfig",
    "RouterConfig",
    "SelectionStrategy",
    "format_duration",
    "load_listener_config",
    "load_router_config",
    "parse",
    "parse_duration",
    "read_yaml",
    "router_warnings",
]
