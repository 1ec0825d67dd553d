"""Errors of the indexer service."""

from __future__ import annotations

from continuum_common.errors import ContinuumError


class IndexerError(ContinuumError):
    """Base of the indexer's deliberate errors."""


class DroppedEvent(IndexerError):
    """A bus message that is not applied (counted under `reason`, logged without its payload,
    and terminated so it is never redelivered)."""

    def __init__(self, reason: str, message: str, backend: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.backend = backend
