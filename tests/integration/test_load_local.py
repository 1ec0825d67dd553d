"""The load view between the workers of one `serve` over real Unix datagram sockets, and the
metrics fan-in over real Unix stream sockets: a worker's load reaches its siblings, a sibling
that is gone or whose queue is full costs a counted drop (never a wait), a report that arrives
over two transports counts once, and a scrape of one worker includes the others'."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import nats
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from continuum_common.config import Backend
from continuum_common.procs import NatsServer
from continuum_ingress.adapters.load_local import LocalLoadTransport
from continuum_ingress.adapters.load_nats import NatsLoadTransport
from continuum_ingress.adapters.worker_metrics import WorkerMetrics, close_exposition, serve_exposition
from continuum_ingress.load_share import LoadShare, LoadTransport
from continuum_ingress.pool import BackendPool
from continuum_ingress.workers import SUPERVISOR, WorkerSeat

BACKENDS = ("w-a", "w-b")


@pytest.fixture
def seat_dir() -> Iterator[Path]:
    """Short on purpose: Unix socket paths are limited to 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="cw-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Worker:
    def __init__(self, seat: WorkerSeat, extra: list[LoadTransport] | None = None) -> None:
        self.seat = seat
        self.pool = BackendPool()
        self.pool.sync([Backend(name=b, url=f"http://127.0.0.1:1/{b}", models=["m"]) for b in BACKENDS])
        self.registry = CollectorRegistry()
        self.local = LocalLoadTransport.for_seat(seat)
        self.share = LoadShare(
            f"worker-{seat.index}",
            self.pool,
            [self.local, *(extra or [])],
            interval_s=0.02,
            stale_after_s=1.0,
            registry=self.registry,
        )

    def remote(self, backend: str) -> tuple[int, int]:
        s = self.pool.get(backend)
        assert s is not None
        return s.remote_in_flight, s.remote_queued_tokens

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def workers(directory: Path, count: int, *, start: int | None = None) -> AsyncIterator[list[Worker]]:
    """`count` seats; the first `start` of them (all by default) running their load view."""
    out = [Worker(WorkerSeat(directory, i, count)) for i in range(count)]
    async with AsyncExitStack() as stack:
        for w in out[: count if start is None else start]:
            await w.share.start()
            stack.push_async_callback(w.share.aclose)
        yield out


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_workers_load_reaches_its_siblings(seat_dir: Path) -> None:
    async with workers(seat_dir, 3) as (zero, one, two):
        a = zero.pool.get("w-a")
        assert a is not None
        a.begin(0.0)
        a.queue_prefill(512)
        b = one.pool.get("w-b")
        assert b is not None
        b.begin(0.0)
        await eventually(lambda: two.remote("w-a") == (1, 512) and two.remote("w-b") == (1, 0))
        await eventually(lambda: zero.remote("w-b") == (1, 0) and zero.remote("w-a") == (0, 0))
        two_a = two.pool.get("w-a")
        assert two_a is not None and two_a.in_flight == 1  # what the CHWBL bound reads
        assert two.sample("continuum_ingress_load_peers") == 2
        a.finish()
        a.prefill_done(512)
        await eventually(lambda: two.remote("w-a") == (0, 0))
        # One datagram per sibling per report.
        assert zero.sample("continuum_ingress_load_reports_total", direction="sent") >= 2
        await one.share.aclose()  # its final report: dropped at once, not at the staleness bound
        await eventually(lambda: two.remote("w-b") == (0, 0), timeout=0.5)


async def test_a_sibling_that_is_gone_is_a_counted_drop(seat_dir: Path) -> None:
    # Worker 1 of 2 never starts (as while it restarts): worker 0 keeps publishing and counts.
    async with workers(seat_dir, 2, start=1) as (zero, _one):
        await eventually(lambda: zero.sample("continuum_ingress_load_reports_dropped_total", reason="peer_gone") >= 3)
        assert zero.sample("continuum_ingress_load_reports_total", direction="sent") == 0
    # A socket file left by a dead worker (nobody bound to it) is gone too.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(WorkerSeat(seat_dir, 1, 2).load_socket(1)))
    stale.close()
    assert WorkerSeat(seat_dir, 1, 2).load_socket(1).exists()
    async with workers(seat_dir, 2, start=1) as (zero, _one):
        await eventually(lambda: zero.sample("continuum_ingress_load_reports_dropped_total", reason="peer_gone") >= 3)


async def test_a_full_sibling_queue_is_a_counted_drop_not_a_wait(seat_dir: Path) -> None:
    # Worker 1's socket exists and is bound, but nobody reads it (its loop is stuck).
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stuck.bind(str(WorkerSeat(seat_dir, 1, 2).load_socket(1)))
    try:
        async with workers(seat_dir, 2, start=1) as (zero, _one):
            # Rounds keep coming after the queue filled: the publisher never waits on it.
            await eventually(
                lambda: zero.sample("continuum_ingress_load_reports_dropped_total", reason="peer_busy") >= 5
            )
            assert zero.sample("continuum_ingress_load_reports_total", direction="sent") >= 1  # before it filled
    finally:
        stuck.close()


async def test_a_report_over_two_transports_counts_once(seat_dir: Path, nats_server: NatsServer) -> None:
    """Workers that are also NATS replicas (KV routing on) hear each other twice; the second copy
    is neither counted again nor a drop, and the local copy keeps the view when NATS goes."""
    async with AsyncExitStack() as stack:
        pair = []
        clients = []
        for i in range(2):
            nc = await nats.connect(nats_server.url)
            stack.push_async_callback(nc.close)
            clients.append(nc)
            seat = WorkerSeat(seat_dir, i, 2)
            w = Worker(seat, [NatsLoadTransport(nc, f"worker-{i}")])
            await w.share.start()
            stack.push_async_callback(w.share.aclose)
            pair.append(w)
        zero, one = pair
        a = zero.pool.get("w-a")
        assert a is not None
        a.begin(0.0)
        await eventually(lambda: one.remote("w-a") == (1, 0))
        await asyncio.sleep(0.3)
        sent_local_and_nats = zero.sample("continuum_ingress_load_reports_total", direction="sent")
        received = one.sample("continuum_ingress_load_reports_total", direction="received")
        # Each report went out twice (one datagram, one NATS message) and was taken once.
        assert received <= sent_local_and_nats / 2 + 2
        assert one.sample("continuum_ingress_load_reports_dropped_total", reason="reordered") <= 1
        await clients[0].close()  # NATS gone for worker 0: its siblings still see its load
        await asyncio.sleep(1.5)  # beyond the staleness bound
        assert one.remote("w-a") == (1, 0)
        assert zero.sample("continuum_ingress_load_reports_dropped_total", reason="bus_down") > 0


async def test_one_workers_scrape_includes_its_siblings_and_the_supervisor(seat_dir: Path) -> None:
    seats = [WorkerSeat(seat_dir, i, 3) for i in range(3)]
    registries = []
    async with AsyncExitStack() as stack:
        for seat in seats[:2]:  # worker 2 is not running
            registry = CollectorRegistry()
            Counter("demo_requests", "Requests", registry=registry).inc(10 + seat.index)
            component = WorkerMetrics(seat, registry, timeout_s=1.0)
            await component.start()
            stack.push_async_callback(component.aclose)
            registries.append((component, registry))
        supervisor = CollectorRegistry()
        Counter("demo_worker_restarts", "Restarts", ["worker"], registry=supervisor).labels("2").inc(4)
        path = seats[0].metrics_socket(SUPERVISOR)
        server = await serve_exposition(path, supervisor)
        stack.push_async_callback(close_exposition, server, path)
        text = await registries[0][0].exposition()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }
    assert samples[("demo_requests_total", (("worker", "0"),))] == 10
    assert samples[("demo_requests_total", (("worker", "1"),))] == 11
    assert samples[("demo_worker_restarts_total", (("worker", "2"),))] == 4
    # Worker 2 did not answer: left out and counted (in the same answer).
    assert ("demo_requests_total", (("worker", "2"),)) not in samples
    assert samples[("continuum_ingress_worker_scrape_failures_total", (("worker", "0"),))] == 1
    # Sockets are removed on close.
    assert not any(seat_dir.glob("metrics-*.sock"))
