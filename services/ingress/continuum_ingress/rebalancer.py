"""Even out client connections between the workers of one `serve` (`server.rebalance_connections`).

Every `interval` each worker tells its siblings how many client connections it holds
(adapters/handoff.py). A worker above the fair share (policy/rebalance.py) hands idle
keep-alive connections to the siblings below it: between two requests, with nothing buffered
either way, a connection's socket is passed as a descriptor and the sibling serves it as if it
had accepted it; the client sees nothing. A connection with a request in flight never moves.

A sibling that took connections is not given more until it has reported again (its count then
includes them), and a report older than three intervals is not used: a worker that stopped or
restarted neither takes nor gives.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Collection
from typing import Any, Protocol

from continuum_ingress.adapters.handoff import MAX_FDS, HandoffError, HandoffSocket, close_fds
from continuum_ingress.metrics import RebalanceMetrics
from continuum_ingress.policy.rebalance import plan_moves
from continuum_ingress.workers import WorkerSeat

log = logging.getLogger(__name__)

STALE_INTERVALS = 3


class Movable(Protocol):
    """A client connection as the balancer sees it (adapters/h1_server.H1ServerProtocol)."""

    def idle(self) -> bool: ...
    def socket_copy(self) -> int: ...
    def let_go(self) -> None: ...


class Served(Protocol):
    """The HTTP server whose connections move (server.RunningServer)."""

    def connections(self) -> Collection[Any]: ...
    async def adopt(self, sock: socket.socket) -> None: ...


class ConnectionBalancer:
    def __init__(
        self,
        seat: WorkerSeat,
        server: Served,
        metrics: RebalanceMetrics,
        *,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        peers = {i: seat.handoff_socket(i) for i in seat.others()}
        self.socket = HandoffSocket(seat.handoff_socket(seat.index), peers)
        self.server = server
        self.metrics = metrics
        self.interval = interval
        self._clock = clock
        self._reports: dict[int, tuple[int, float]] = {}  # sibling -> (count, when received)
        self._given: set[int] = set()  # siblings given connections since their last report
        self._adopting: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()

    async def run(self) -> None:
        """Until `stop()`; the caller's TaskGroup owns it."""
        self.socket.open(self._on_count, self._on_fds)
        try:
            while not self._stop.is_set():
                try:
                    await asyncio.wait_for(self._stop.wait(), self.interval)
                except TimeoutError:
                    self.tick()
        finally:
            self.socket.close()
            for task in list(self._adopting):
                await task

    def stop(self) -> None:
        self._stop.set()

    # -- giving ------------------------------------------------------------------------------
    def tick(self) -> None:
        mine = len(self.server.connections())
        for reason in self.socket.announce(mine):
            self.metrics.failures[reason].inc()
        fresh_after = self._clock() - STALE_INTERVALS * self.interval
        counts = {i: count for i, (count, at) in self._reports.items() if at >= fresh_after}
        moves = [m for m in plan_moves(mine, counts, limit=MAX_FDS) if m.to not in self._given]
        if not moves:
            return
        idle = [c for c in self.server.connections() if c.idle()]
        for move in moves:
            chosen, idle = idle[: move.count], idle[move.count :]
            moved = self._give(move.to, chosen) if chosen else 0
            if moved:
                count, at = self._reports[move.to]
                self._reports[move.to] = (count + moved, at)
                self._given.add(move.to)

    def _give(self, sibling: int, candidates: list[Movable]) -> int:
        """Hand `candidates` to `sibling`; how many went."""
        fds: list[int] = []
        connections: list[Movable] = []
        for candidate in candidates:
            try:
                fds.append(candidate.socket_copy())
            except (OSError, AttributeError):  # closed since it was found idle: it stays
                continue
            connections.append(candidate)
        if not fds:
            return 0
        try:
            self.socket.send_fds(sibling, fds)
        except HandoffError as exc:
            self.metrics.failures[exc.reason].inc()
            return 0
        finally:
            close_fds(fds)  # sent or not, the kernel holds its own references now
        for connection in connections:
            connection.let_go()
        self.metrics.moved_out.inc(len(connections))
        log.debug("handed %d idle connections to worker %d", len(connections), sibling)
        return len(connections)

    # -- taking ------------------------------------------------------------------------------
    def _on_count(self, sibling: int, count: int) -> None:
        self._reports[sibling] = (count, self._clock())
        self._given.discard(sibling)

    def _on_fds(self, fds: list[int]) -> None:
        for fd in fds:
            try:
                sock = socket.socket(fileno=fd)
            except OSError:
                close_fds([fd])
                self.metrics.failures["adopt_failed"].inc()
                continue
            if self._stop.is_set() or sock.type != socket.SOCK_STREAM:
                sock.close()  # stopping (or not a connection): the client sees its idle connection close
                self.metrics.failures["adopt_failed"].inc()
                continue
            task = asyncio.get_running_loop().create_task(self._adopt(sock))
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    async def _adopt(self, sock: socket.socket) -> None:
        try:
            await self.server.adopt(sock)
        except Exception:  # one connection lost, the worker keeps serving
            log.warning("could not serve a connection handed over by a sibling worker", exc_info=True)
            sock.close()
            self.metrics.failures["adopt_failed"].inc()
            return
        self.metrics.moved_in.inc()
