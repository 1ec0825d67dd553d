"""Load reports between the workers of one `serve` over Unix datagram sockets in the
supervisor's private directory (workers.py): worker i receives on `load-<i>.sock` and sends
each report to every sibling's socket.

Sends never wait. The socket is non-blocking; a sibling whose receive queue is full (its event
loop is busy; Linux queues `net.unix.max_dgram_qlen` datagrams, often 10) costs a counted drop
(`peer_busy`), as does a sibling that is gone or not started yet (`peer_gone`: no socket file,
or nobody bound to it). The next report, one interval later, replaces the lost one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from continuum_ingress.load_transport import Delivery
from continuum_ingress.workers import WorkerSeat

# Room for reports from many siblings while the loop is busy (the kernel caps it at rmem_max).
RECEIVE_BUFFER_BYTES = 1 << 20


class _Receiver(asyncio.DatagramProtocol):
    def __init__(self, receive: Callable[[bytes], None]) -> None:
        self.receive = receive

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.receive(data)


class LocalLoadTransport:
    name = "local"

    def __init__(self, path: Path, peers: Sequence[Path]) -> None:
        self.path = path
        self.peers = [str(p) for p in peers]
        self._endpoint: asyncio.DatagramTransport | None = None
        self._out: socket.socket | None = None

    @classmethod
    def for_seat(cls, seat: WorkerSeat) -> LocalLoadTransport:
        return cls(seat.load_socket(seat.index), [seat.load_socket(i) for i in seat.others()])

    @property
    def connected(self) -> bool:
        return self._endpoint is not None

    async def open(self, receive: Callable[[bytes], None]) -> None:
        # A restarted worker finds its previous incarnation's socket file.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
            sock.bind(str(self.path))
            loop = asyncio.get_running_loop()
            self._endpoint, _ = await loop.create_datagram_endpoint(lambda: _Receiver(receive), sock=sock)
        except BaseException:
            sock.close()
            raise
        out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        out.setblocking(False)
        self._out = out

    async def publish(self, payload: bytes) -> Delivery:
        out = self._out
        if out is None:
            return Delivery(dropped=("not_open",) * len(self.peers))
        sent = 0
        dropped: list[str] = []
        for peer in self.peers:
            try:
                out.sendto(payload, peer)
                sent += 1
            except BlockingIOError:
                dropped.append("peer_busy")
            except (FileNotFoundError, ConnectionRefusedError):
                dropped.append("peer_gone")
            except OSError as exc:
                dropped.append("too_large" if exc.errno == errno.EMSGSIZE else "publish_failed")
        return Delivery(sent, tuple(dropped))

    async def flush(self) -> None:
        """Nothing is buffered: a datagram is in the peer's queue or was dropped."""

    async def close(self) -> None:
        endpoint, self._endpoint = self._endpoint, None
        out, self._out = self._out, None
        if endpoint is not None:
            endpoint.close()
        if out is not None:
            out.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
