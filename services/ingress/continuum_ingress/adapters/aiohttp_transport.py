"""An aiohttp-based `Transport` (transport.py), the alternative to the hand-written HTTP/1.1
pool (adapters/h1.py) measured by the ingress benchmark (`python -m
continuum_bench.ingress_latency --transport aiohttp`; docs/benchmarks.md). aiohttp is not a
core dependency: `pip install -e '.[bench]'`.

Timeouts as the pool's: connect (which also bounds the wait for a free pooled connection) ->
`ConnectFailed`; every wait for bytes, the head included -> `ReadTimeout`, with the response's
`read_timeout` lowered while it streams (the stream-idle timeout) enforced per chunk. Bodies
are not decompressed; closing a response before its end closes its connection.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from urllib.parse import urlsplit

import aiohttp

from continuum_common.config import Backend
from continuum_ingress.transport import ConnectFailed, Disconnected, ReadTimeout, UpstreamError

KEEPALIVE_EXPIRY_S = 30.0
# aiohttp adds these unless told not to; the dialects set what the backend needs.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding")


def _upstream_error(exc: BaseException) -> UpstreamError:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectFailed(f"connect timed out ({exc})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectFailed(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, TimeoutError):  # aiohttp.SocketTimeoutError, ServerTimeoutError
        return ReadTimeout("no answer from the server within the read timeout")
    return Disconnected(f"{type(exc).__name__}: {exc}")


class AiohttpResponse:
    """An `UpstreamResponse` over one aiohttp response."""

    __slots__ = ("_done", "_limit", "_response", "headers", "read_timeout", "status")

    def __init__(self, response: aiohttp.ClientResponse, read_timeout: float) -> None:
        self._response = response
        self._limit = read_timeout  # what aiohttp's own per-read timeout enforces
        self._done = False
        self.read_timeout = read_timeout
        self.status = response.status
        self.headers = [(k.lower(), v) for k, v in response.raw_headers]

    async def stream(self) -> AsyncIterator[bytes]:
        content = self._response.content
        try:
            while True:
                if self.read_timeout < self._limit:
                    async with asyncio.timeout(self.read_timeout):
                        chunk = await content.readany()
                else:
                    chunk = await content.readany()
                if not chunk:
                    self._done = True
                    return
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _upstream_error(exc) from None

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.stream()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        if self._done:
            self._response.release()  # back to the pool
        else:
            self._response.close()  # unread body: the connection goes


class AiohttpTransport:
    """Keep-alive connections to one origin through one aiohttp session (a `Transport`)."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        keepalive_expiry: float = KEEPALIVE_EXPIRY_S,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self.tls_context = tls_context
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Built on first use: a session belongs to the running event loop.
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=self.max_connections,
            keepalive_timeout=self.keepalive_expiry,
            ssl=self.tls_context if self.tls_context is not None else True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=_SKIP_AUTO_HEADERS
        )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes = b"",
        *,
        read_timeout: float | None = None,
    ) -> AiohttpResponse:
        limit = self.read_timeout if read_timeout is None else read_timeout
        session = self._session or self._open()
        timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout, sock_read=limit)
        try:
            response = await session.request(
                method,
                self.origin + path,
                headers=list(headers),
                data=body if body or method == "POST" else None,
                timeout=timeout,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _upstream_error(exc) from None
        return AiohttpResponse(response, limit)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def aiohttp_transport(spec: Backend, tls_context: ssl.SSLContext | None) -> AiohttpTransport:
    """A `TransportFactory`: the backend's connect/request timeouts and connection limit."""
    return AiohttpTransport(
        spec.url,
        connect_timeout=spec.connect_timeout_ms / 1000,
        read_timeout=spec.request_timeout_ms / 1000,
        max_connections=spec.max_connections,
        tls_context=tls_context,
    )
