"""Errors of the response cache. None of them ever reaches a chat request: the facade turns
every one into a miss (or a skipped store) and counts it."""

from __future__ import annotations

from enum import StrEnum

from continuum_common.errors import ContinuumError


class CacheError(ContinuumError):
    """Base class of everything the response cache raises on purpose."""


class EntryFormatError(CacheError):
    """A stored entry could not be decoded (foreign data, another version, corruption)."""


class InvalidateRequestError(CacheError):
    """The body of `POST /admin/response-cache/invalidate` is not one this cache understands."""


class BackendErrorKind(StrEnum):
    """The seed's error classes of the stats endpoint (`redis.errors.{connection,timeout,other}`)."""

    CONNECTION = "connection"
    TIMEOUT = "timeout"
    OTHER = "other"


class CacheBackendError(CacheError):
    """A shared-store command failed. `kind` decides whether the fallback switches over:
    connection failures and timeouts do (the seed: "초과 시 인메모리 폴백 활성화"), other
    errors (a full pool, a server-side error reply) only count and miss."""

    def __init__(self, kind: BackendErrorKind, operation: str, detail: str) -> None:
        super().__init__(f"{operation}: {kind} error: {detail}")
        self.kind = kind
        self.operation = operation

    @property
    def is_outage(self) -> bool:
        return self.kind is not BackendErrorKind.OTHER
