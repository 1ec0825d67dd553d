"""Client connections handed between two workers' HTTP servers (continuum_ingress.rebalancer over
adapters/handoff.py), here two real servers in one process on loopback with their hand-over
sockets in a temporary directory, as two workers of one `serve` would have: the busier one
gives idle keep-alive connections to the other, the clients keep using them without noticing,
and a connection with a request in flight stays where it is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from continuum_ingress.edge import EdgeGuard, EdgeLimits
from continuum_ingress.metrics import RebalanceMetrics
from continuum_ingress.rebalancer import ConnectionBalancer
from continuum_ingress.server import RunningServer
from continuum_ingress.workers import WorkerSeat

Scope = dict[str, Any]


class TaggedApp:
    """Answers every request with its server's tag; `/hold` waits for `release`."""

    def __init__(self, tag: bytes) -> None:
        self.tag = tag
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/hold":
            self.holding.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]})
        await send({"type": "http.response.body", "body": self.tag})


class Worker:
    def __init__(self, server: RunningServer, app: TaggedApp, balancer: ConnectionBalancer, metrics: RebalanceMetrics):
        self.server, self.app, self.balancer, self.metrics = server, app, balancer, metrics


@contextlib.asynccontextmanager
async def two_workers(directory: Path) -> AsyncIterator[tuple[Worker, Worker]]:
    workers: list[Worker] = []
    async with contextlib.AsyncExitStack() as stack:
        for index, tag in enumerate((b"A", b"B")):
            app = TaggedApp(tag)
            server = await stack.enter_async_context(RunningServer(app, edge=EdgeGuard(EdgeLimits(), None)))
            metrics = RebalanceMetrics(CollectorRegistry())
            balancer = ConnectionBalancer(WorkerSeat(directory, index, 2), server, metrics, interval=3600)
            balancer.socket.open(balancer._on_count, balancer._on_fds)
            stack.callback(balancer.socket.close)
            workers.append(Worker(server, app, balancer, metrics))
        yield workers[0], workers[1]


class Client:
    """One keep-alive connection, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, path: str = "/") -> None:
        self.writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())

    async def answer(self) -> bytes:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200"), head
        return await asyncio.wait_for(self.reader.readexactly(1), 5)

    async def ask(self, path: str = "/") -> bytes:
        self.send(path)
        return await self.answer()


async def exchange_counts(a: Worker, b: Worker) -> None:
    b.balancer.tick()  # B reports its count to A
    await asyncio.sleep(0.05)
    a.balancer.tick()  # A reports, plans and gives
    await asyncio.sleep(0.1)  # B adopts


async def test_the_busier_worker_hands_idle_connections_over_and_the_clients_keep_using_them(tmp_path: Path) -> None:
    async with two_workers(tmp_path) as (a, b):
        clients = [await Client.open(a.server.port) for _ in range(6)]
        assert [await c.ask() for c in clients] == [b"A"] * 6
        await exchange_counts(a, b)
        assert (len(a.server.connections()), len(b.server.connections())) == (3, 3)
        tags = [await c.ask() for c in clients]
        assert sorted(tags) == [b"A"] * 3 + [b"B"] * 3
        # the moved connections stay usable for many requests, on their new worker
        for _ in range(5):
            assert [await c.ask() for c in clients] == tags
        assert a.metrics.moved_out._value.get() == 3
        assert b.metrics.moved_in._value.get() == 3


async def test_a_request_sent_during_the_hand_over_is_answered_by_the_new_worker(tmp_path: Path) -> None:
    async with two_workers(tmp_path) as (a, b):
        clients = [await Client.open(a.server.port) for _ in range(2)]
        for c in clients:
            await c.ask()
        b.balancer.tick()
        await asyncio.sleep(0.05)
        a.balancer.tick()  # one descriptor is on its way to B now
        for c in clients:
            c.send()  # before B has adopted it: the request waits in the socket, not in A
        assert sorted([await c.answer() for c in clients]) == [b"A", b"B"]


async def test_a_connection_with_a_request_in_flight_does_not_move(tmp_path: Path) -> None:
    async with two_workers(tmp_path) as (a, b):
        busy = [await Client.open(a.server.port) for _ in range(4)]
        for c in busy:
            c.send("/hold")
        await asyncio.wait_for(a.app.holding.wait(), 5)
        await asyncio.sleep(0.05)
        await exchange_counts(a, b)
        assert len(a.server.connections()) == 4 and len(b.server.connections()) == 0
        a.app.release.set()
        assert [await c.answer() for c in busy] == [b"A"] * 4
        await exchange_counts(a, b)  # idle now: two of them move
        assert len(b.server.connections()) == 2


async def test_a_balanced_pair_moves_nothing_and_a_gone_sibling_takes_nothing(tmp_path: Path) -> None:
    async with two_workers(tmp_path) as (a, b):
        clients = [await Client.open(a.server.port) for _ in range(3)]
        clients += [await Client.open(b.server.port) for _ in range(2)]
        for c in clients:
            await c.ask()
        await exchange_counts(a, b)
        assert (len(a.server.connections()), len(b.server.connections())) == (3, 2)
        b.balancer.socket.close()  # B is gone; A still has its last report
        for _ in range(3):
            clients.append(await Client.open(a.server.port))
            await clients[-1].ask()
        a.balancer.tick()
        assert len(a.server.connections()) == 6
        assert a.metrics.failures["peer_gone"]._value.get() >= 1
        assert [await c.ask() for c in clients[:3]] == [b"A"] * 3
