"""Errors the listener raises on purpose. Every one derives from ContinuumError."""

from __future__ import annotations

from continuum_common.errors import ContinuumError


class ListenerError(ContinuumError):
    """Base class of the listener's deliberate errors."""


class DecodeError(ListenerError, ValueError):
    """An engine message could not be decoded. `reason` is a metric label value from
    `protocol.model.DROP_REASONS`; the message text never contains payload bytes."""

    def __init__(self, reason: str, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason = reason


class DetokenizeError(ListenerError):
    """A /detokenize call failed (transport error, timeout, non-200, bad body)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
