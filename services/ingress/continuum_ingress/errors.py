"""The ingress's error hierarchy.

`RequestError` carries everything needed to answer the client in the right provider shape
(OpenAI on `/v1/*`, Anthropic on `/anthropic/*`); the HTTP layer turns it into a response and
never lets it become a 500.
"""

from __future__ import annotations

from continuum_common.errors import ContinuumError


class IngressError(ContinuumError):
    """Base of every error the ingress raises on purpose."""


class RequestError(IngressError):
    """A request that cannot be served, with the status and body fields to answer it.

    `kind` is a provider-neutral name (`invalid_request`, `not_found`, `too_large`,
    `bad_gateway`, `unavailable`, `timeout`, `auth`); the error-body builders map it to the
    OpenAI `type`/`code` or the Anthropic `error.type`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code


class InvalidRequest(RequestError):
    """400: malformed JSON, a wrong type or a missing field (`param` names it)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(400, message, kind="invalid_request", param=param, code=code)


class NoBackend(RequestError):
    """503: no eligible backend is healthy for this model."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, kind="unavailable", code="no_healthy_backend")
