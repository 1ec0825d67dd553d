"""Errors of the gemini-cache service."""

from __future__ import annotations

from continuum_common.errors import ConfigError, ContinuumError


class GeminiCacheError(ContinuumError):
    """Base class of the errors this service raises on purpose."""


class DisabledError(GeminiCacheError, ConfigError):
    """`gemini_context_cache.enabled` is false: the service refuses to start."""


class StateError(GeminiCacheError):
    """The shared state store failed or holds a record this version cannot read."""
