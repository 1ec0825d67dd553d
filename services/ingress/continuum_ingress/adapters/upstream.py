"""One pooled keep-alive httpx.AsyncClient per backend.

Clients are created for a configuration snapshot and reused by later snapshots while the
backend's address and limits are unchanged. A client a reload made obsolete is retired, not
closed: it is closed once no request holds a snapshot that can still use it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping

import httpx

from continuum_common.config import Backend

log = logging.getLogger(__name__)

KEEPALIVE_EXPIRY_S = 30.0


def _client_key(spec: Backend) -> tuple[object, ...]:
    return (spec.url, spec.connect_timeout_ms, spec.request_timeout_ms, spec.max_connections)


class UpstreamClient:
    __slots__ = ("http", "key", "name", "url")

    def __init__(self, spec: Backend) -> None:
        self.name = spec.name
        self.url = spec.url
        self.key = _client_key(spec)
        connect = spec.connect_timeout_ms / 1000
        read = spec.request_timeout_ms / 1000
        self.http = httpx.AsyncClient(
            # connect and pool waits are bounded by the connect timeout; read/write by the
            # request timeout (per chunk for streams: a long generation is fine, a stall is not).
            timeout=httpx.Timeout(connect=connect, read=read, write=read, pool=connect),
            limits=httpx.Limits(
                max_connections=spec.max_connections,
                max_keepalive_connections=spec.max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
            # Never pick up proxies from the environment for backend traffic.
            trust_env=False,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.http.aclose()


class ClientSet:
    """Backend name -> current client; retired clients wait for close_unused()."""

    def __init__(self) -> None:
        self._current: dict[str, UpstreamClient] = {}
        self._retired: list[UpstreamClient] = []

    def sync(self, backends: Iterable[Backend]) -> Mapping[str, UpstreamClient]:
        fresh: dict[str, UpstreamClient] = {}
        for spec in backends:
            client = self._current.get(spec.name)
            if client is None or client.key != _client_key(spec):
                client = UpstreamClient(spec)
            fresh[spec.name] = client
        kept = {id(c) for c in fresh.values()}
        self._retired.extend(c for c in self._current.values() if id(c) not in kept)
        self._current = fresh
        return dict(fresh)

    async def close_unused(self, still_used: Iterable[Mapping[str, UpstreamClient]]) -> int:
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
