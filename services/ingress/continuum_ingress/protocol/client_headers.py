"""The client request headers that matter upstream (read once by the HTTP layer, asgi.py)."""

from __future__ import annotations

from dataclasses import dataclass


# Not frozen (built per request; a frozen dataclass costs 4x to build). Treat as immutable.
@dataclass(slots=True)
class ClientHeaders:
    """The client headers that matter upstream (read once by the HTTP layer).

    Credentials are forwarded only to backends that have no key of their own configured, and
    are never logged."""

    bearer: str | None = None
    x_api_key: str | None = None
    anthropic_version: str | None = None
    anthropic_beta: str | None = None
    # traceparent, tracestate, x-request-id: forwarded as is.
    passthrough: tuple[tuple[str, str], ...] = ()

    @property
    def api_key(self) -> str | None:
        return self.bearer or self.x_api_key
