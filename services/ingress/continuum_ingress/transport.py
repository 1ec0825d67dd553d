"""The upstream HTTP transport interface: what forwarding, health checks and tokenize calls need
from the client that talks to a backend, and the errors it raises.

A `Transport` sends one request to one backend origin and returns once the response head
arrived; the body is then read as an async iterator (`UpstreamResponse.stream`). Its timeouts:

* connect (and the wait for a free pooled connection): fixed per transport, from the backend's
  `connect_timeout_ms`; exceeded -> `ConnectFailed`;
* every wait for bytes (the head, then each body chunk): `read_timeout` of the request (default
  the backend's `request_timeout_ms`), changeable on the response while it streams (the
  forwarder lowers it to `stream_idle_timeout_ms` once a stream's first chunk arrived);
  exceeded -> `ReadTimeout`;
* the first byte of a stream is bounded by the forwarder itself (`first_byte_timeout_ms`,
  forwarding.py), around `request` and the first chunk.

Closing a response before its end must close its connection (the backend sees the client go
and stops generating). A response may also offer `async pump(sink)`, handing its body to a
synchronous `sink(chunk) -> bool` from the connection's callbacks (adapters/h1.Response.pump);
the forwarder relays a stream through it when it can. The hand-written HTTP/1.1 pool (adapters/h1.py) is the production
implementation; adapters/aiohttp_transport.py is a benchmark alternative.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from continuum_common.config import Backend


class UpstreamError(Exception):
    """Base of the transport's errors."""


class ConnectFailed(UpstreamError):
    """Could not open a connection (refused, unreachable, TLS, connect or pool timeout)."""


class Disconnected(UpstreamError):
    """The server closed the connection or sent something that is not HTTP."""


class ReadTimeout(UpstreamError):
    """No bytes from the server within the read timeout."""


class UpstreamResponse(Protocol):
    """One upstream response. Iterate `stream()` or call `read()`, then always `aclose()`.
    Header names are lower-case bytes."""

    status: int
    headers: list[tuple[bytes, bytes]]
    read_timeout: float

    def stream(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


class Transport(Protocol):
    """Requests to one backend origin (scheme://host:port)."""

    async def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes = b"",
        *,
        read_timeout: float | None = None,
    ) -> UpstreamResponse:
        """Send one request with a complete body; return once the response head arrived.
        `path` is the full request target. Raises ConnectFailed, Disconnected or ReadTimeout."""
        ...

    async def aclose(self) -> None: ...


class TransportFactory(Protocol):
    """Builds the transport for one backend (its URL, timeouts and connection limit)."""

    def __call__(self, spec: Backend, tls_context: ssl.SSLContext | None) -> Transport: ...


class Upstream(Protocol):
    """One backend's client: its URL, the request target of an API path under that URL (which
    may carry a path prefix such as /v1), and the transport."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def transport(self) -> Transport: ...

    def target(self, path: str) -> str: ...


class UpstreamSet(Protocol):
    """Backend name -> client, kept in step with each configuration snapshot."""

    def sync(self, backends: Iterable[Backend]) -> Mapping[str, Upstream]: ...
