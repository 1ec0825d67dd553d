"""Connection hand-over between the workers of one `serve`: a Unix datagram socket per worker in
the supervisor's private directory (workers.py, `handoff-<i>.sock`) that carries two messages.

* `C` + a 4-byte count: the sender's open client connections (every interval, to every sibling);
* `F` with the descriptors of client connections in SCM_RIGHTS ancillary data: the receiver
  serves them from now on (continuum_ingress.rebalancer decides which and how many).

Sends never wait: the socket is non-blocking, and a sibling whose queue is full or that is gone
costs a counted failure (`peer_busy`, `peer_gone`). A descriptor sent is the kernel's until the
receiver takes it; if the receiver never does (it exited), the kernel closes it there and the
connection ends as an idle keep-alive connection may.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

MAX_FDS = 64  # descriptors per message (the kernel allows 253)
_COUNT = struct.Struct("!cI")
_FDS = b"F"
_RECEIVE_BYTES = 64


class HandoffError(Exception):
    """A send that did not happen; `reason` is the metric label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HandoffSocket:
    """This worker's end: receives on `path`, sends to the siblings' paths."""

    def __init__(self, path: Path, peers: dict[int, Path]) -> None:
        self.path = path
        self.peers = {index: str(p) for index, p in peers.items()}
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, on_count: Callable[[int, int], None], on_fds: Callable[[list[int]], None]) -> None:
        """Bind and start receiving: `on_count(sibling, count)` for each count report,
        `on_fds(fds)` for each batch of descriptors (the callee owns them)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a restarted worker finds its previous incarnation's socket file
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.bind(str(self.path))
        except BaseException:
            sock.close()
            raise
        by_path = {p: index for index, p in self.peers.items()}
        loop = asyncio.get_running_loop()
        loop.add_reader(sock.fileno(), self._read, sock, by_path, on_count, on_fds)
        self._sock, self._loop = sock, loop

    def _read(
        self,
        sock: socket.socket,
        by_path: dict[str, int],
        on_count: Callable[[int, int], None],
        on_fds: Callable[[list[int]], None],
    ) -> None:
        while True:
            try:
                data, fds, _flags, address = socket.recv_fds(sock, _RECEIVE_BYTES, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed under us
            if fds:
                if address in by_path:
                    on_fds(fds)
                else:  # only siblings hand over connections
                    close_fds(fds)
            elif len(data) == _COUNT.size and data[:1] == b"C" and address in by_path:
                on_count(by_path[address], _COUNT.unpack(data)[1])

    def announce(self, count: int) -> list[str]:
        """Send `count` to every sibling; the reasons of the sends that failed."""
        payload = _COUNT.pack(b"C", count)
        failed: list[str] = []
        for peer in self.peers:
            try:
                self._send(peer, payload, ())
            except HandoffError as exc:
                failed.append(exc.reason)
        return failed

    def send_fds(self, peer: int, fds: Sequence[int]) -> None:
        """Hand `fds` (at most MAX_FDS) to sibling `peer`; raises HandoffError when they did not
        leave. The caller still owns its descriptors either way (the kernel holds its own)."""
        if len(fds) > MAX_FDS:
            raise ValueError(f"at most {MAX_FDS} descriptors per message")
        self._send(peer, _FDS, fds)

    def _send(self, peer: int, payload: bytes, fds: Sequence[int]) -> None:
        sock = self._sock
        if sock is None:
            raise HandoffError("not_open")
        try:
            if fds:
                # socket.send_fds ignores its address argument: sendmsg takes it.
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                sock.sendmsg([payload], rights, 0, self.peers[peer])
            else:
                sock.sendto(payload, self.peers[peer])
        except BlockingIOError:
            raise HandoffError("peer_busy") from None
        except (FileNotFoundError, ConnectionRefusedError):
            raise HandoffError("peer_gone") from None
        except OSError:
            raise HandoffError("send_failed") from None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
