"""ZAP handler (ZeroMQ RFC 27) enforcing `allowed_publishers` for sources in bind mode.

A bound SUB socket accepts any peer that can reach the port; with a ZAP domain set on the socket,
libzmq asks this handler about every new peer (NULL mechanism: the peer's IP address). The
domain names the source, so each source has its own allow-list; refusals are counted.
IPC peers have no address and are accepted: file-system permissions guard an ipc:// endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq
import zmq.asyncio

log = logging.getLogger("continuum.listener.zap")
ZAP_ENDPOINT = "inproc://zeromq.zap.01"


class ZapHandler:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        allowed: dict[str, frozenset[str]],
        on_denied: Callable[[str], None],
    ) -> None:
        """`allowed`: ZAP domain → allowed peer IP addresses."""
        self.allowed = allowed
        self.on_denied = on_denied
        self.socket = ctx.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        # Bound at construction, before any source socket exists: libzmq only consults a
        # handler that is already there when a peer connects.
        self.socket.bind(ZAP_ENDPOINT)

    def decide(self, domain: str, address: str) -> bool:
        allowed = self.allowed.get(domain)
        if allowed is None:
            return False
        return address == "" or address in allowed

    async def run(self) -> None:
        try:
            while True:
                request = await self.socket.recv_multipart()
                await self.socket.send_multipart(self._reply(request))
        finally:
            self.socket.close(linger=0)

    def _reply(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6:
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"bad ZAP request", b"", b""]
        version, request_id, domain_b, address_b = request[:4]
        domain = domain_b.decode("utf-8", "replace")
        address = address_b.decode("utf-8", "replace")
        if self.decide(domain, address):
            return [version, request_id, b"200", b"OK", b"", b""]
        self.on_denied(domain)
        log.warning("refused ZMQ publisher %s for %s (not in allowed_publishers)", address, domain)
        return [version, request_id, b"400", b"address not allowed", b"", b""]
