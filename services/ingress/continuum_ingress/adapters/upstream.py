"""One client per backend: its URL, request targets and transport (transport.py), by default
the pooled keep-alive HTTP/1.1 client of adapters/h1.py (`H1Transports`).

Clients are created for a configuration snapshot and reused by later snapshots while the
backend's address and limits are unchanged. A client a reload made obsolete is retired, not
closed: it is closed once no request holds a snapshot that can still use it.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from continuum_common.config import Backend
from continuum_ingress.adapters.h1 import H1Pool, Outbox
from continuum_ingress.protocol.dialects import join_url
from continuum_ingress.transport import Transport, TransportFactory

log = logging.getLogger(__name__)

KEEPALIVE_EXPIRY_S = 30.0


def _client_key(spec: Backend) -> tuple[object, ...]:
    return (spec.url, spec.connect_timeout_ms, spec.request_timeout_ms, spec.max_connections)


class H1Transports:
    """The production `TransportFactory`: connect and pool waits are bounded by the connect
    timeout; reads by the request timeout, per wait for bytes (a long stream is fine, a stalled
    one is not). Every pool it builds shares one `Outbox`, so the requests one turn of the loop
    sends to all backends leave together at its end."""

    def __init__(self) -> None:
        self.outbox = Outbox()

    def __call__(self, spec: Backend, tls_context: ssl.SSLContext | None) -> H1Pool:
        return H1Pool(
            spec.url,
            connect_timeout=spec.connect_timeout_ms / 1000,
            read_timeout=spec.request_timeout_ms / 1000,
            max_connections=spec.max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
            tls_context=tls_context,
            outbox=self.outbox,
        )


class UpstreamClient:
    """An `Upstream` (transport.py)."""

    __slots__ = ("_paths", "key", "name", "transport", "url")

    def __init__(self, spec: Backend, transport: Transport) -> None:
        self.name = spec.name
        self.url = spec.url
        self.key = _client_key(spec)
        self.transport = transport
        self._paths: dict[str, str] = {}

    def target(self, path: str) -> str:
        """The request target for an API path under this backend's URL (which may carry a
        path prefix such as /v1 or /v1beta/openai)."""
        target = self._paths.get(path)
        if target is None:
            target = self._paths[path] = urlsplit(join_url(self.url, path)).path
        return target

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.transport.aclose()


class ClientSet:
    """Backend name -> current client (an `UpstreamSet`); retired clients wait for
    close_unused()."""

    def __init__(self, transport: TransportFactory | None = None) -> None:
        self._transport = transport or H1Transports()
        self._current: dict[str, UpstreamClient] = {}
        self._retired: list[UpstreamClient] = []
        self._tls: ssl.SSLContext | None = None

    def _tls_context(self) -> ssl.SSLContext:
        # Loading the CA bundle takes tens of milliseconds: once per process, shared by pools.
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def sync(self, backends: Iterable[Backend]) -> Mapping[str, UpstreamClient]:
        fresh: dict[str, UpstreamClient] = {}
        for spec in backends:
            client = self._current.get(spec.name)
            if client is None or client.key != _client_key(spec):
                tls = self._tls_context() if spec.url.startswith("https:") else None
                client = UpstreamClient(spec, self._transport(spec, tls))
            fresh[spec.name] = client
        kept = {id(c) for c in fresh.values()}
        self._retired.extend(c for c in self._current.values() if id(c) not in kept)
        self._current = fresh
        return dict(fresh)

    async def close_unused(self, still_used: Iterable[Mapping[str, object]]) -> int:
        """Close retired clients that no live snapshot references; return how many closed."""
        used = {id(c) for clients in still_used for c in clients.values()}
        closing = [c for c in self._retired if id(c) not in used]
        self._retired = [c for c in self._retired if id(c) in used]
        for client in closing:
            await client.aclose()
        if closing:
            log.info("closed %d retired backend client(s)", len(closing))
        return len(closing)

    async def aclose(self) -> None:
        for client in [*self._current.values(), *self._retired]:
            await client.aclose()
        self._current, self._retired = {}, []
