"""`continuum-router serve` with `server.workers: 2` as real processes on a real port: both
workers take connections on the one port, a killed worker is restarted while the port keeps
serving, SIGHUP reloads every worker, SIGTERM drains them all, the workers die with their
supervisor, a worker that cannot start fails serve with one line, the CHWBL bound holds
across the workers (the shared load view), and with `rebalance_connections` long-lived
connections end up spread evenly."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from continuum_common.children import process_alive
from continuum_common.ring import load_bound
from continuum_testing.ingress_harness import stub_backends
from continuum_testing.up_process import ROUTER, children_of, kill_leftovers, port_open, run_to_end
from continuum_testing.upstream_stub import RunningStub, running_stubs

CHAT = {
    "model": "m",
    "messages": [{"role": "system", "content": "one hot prefix " * 8}, {"role": "user", "content": "hi"}],
}
START_LIMIT_S = 60.0  # two interpreters importing the whole ingress on a busy 2-core machine


class Serve:
    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])

    def workers(self) -> set[int]:
        return children_of(self.proc.pid)

    def client(self) -> httpx.AsyncClient:
        """Every request on a new connection, so the kernel picks a worker for each."""
        return httpx.AsyncClient(
            base_url=self.url,
            timeout=30,
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"connection": "close"},
        )

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        async with self.client() as client:
            r = await client.get("/metrics")
        assert r.status_code == 200, r.text
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(r.text)
            for s in family.samples
        }


def per_worker(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> dict[str, float]:
    """Sum of `name` per worker over the samples that carry `labels`."""
    out: dict[str, float] = {}
    for (sample, sample_labels), value in samples.items():
        found = dict(sample_labels)
        if sample == name and all(found.get(k) == v for k, v in labels.items()) and "worker" in found:
            out[found["worker"]] = out.get(found["worker"], 0.0) + value
    return out


def write_config(path: Path, stubs: list[RunningStub], **extra: Any) -> None:
    data = {"server": {"workers": 2}, "backends": stub_backends(stubs), **extra}
    path.write_text(yaml.safe_dump(data))


@contextlib.asynccontextmanager
async def serve(config: Path, *args: str) -> AsyncIterator[Serve]:
    proc = await asyncio.create_subprocess_exec(
        *ROUTER, "serve", "--config", str(config), "--port", "0", *args,
        env={**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: set[int] = set()
    try:
        async with asyncio.timeout(START_LIMIT_S):
            line = (await proc.stdout.readline()).decode()
        match = re.search(r"listening on (http://\S+) \(2 workers\)", line)
        assert match, line
        running = Serve(proc, match.group(1))
        seen |= running.workers()
        assert len(seen) == 2
        yield running
        seen |= running.workers()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(60):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        kill_leftovers(sorted(seen))


async def eventually(check: Callable[[], Any], limit: float = 30.0, pause: float = 0.1) -> None:
    """Until `check()` (sync or async) is true."""
    async with asyncio.timeout(limit):
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            await asyncio.sleep(pause)


async def test_both_workers_take_connections_on_one_port(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    async with running_stubs("a") as stubs:
        write_config(config, stubs)
        async with serve(config) as running, running.client() as client:
            replies = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(30)]
            assert all(r.status_code == 200 for r in replies)
            samples = await running.metrics()
            served = per_worker(samples, "continuum_ingress_requests_total", endpoint="chat_completions", status="2xx")
            assert set(served) == {"0", "1"} and all(n > 0 for n in served.values()), served
            assert sum(served.values()) == 30
            assert samples[("continuum_ingress_workers_running", frozenset())] == 2


async def keep_alive_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    body = orjson.dumps(CHAT)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    async with asyncio.timeout(30):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
    return head.split(b"\r\n", 1)[0]


async def test_with_rebalancing_long_lived_connections_are_spread_evenly_over_the_workers(tmp_path: Path) -> None:
    # The kernel's hash splits 40 connections 20/20 one time in eight; the workers even out
    # whatever split it made by handing idle keep-alive connections over (rebalancer.py).
    config = tmp_path / "router.yaml"
    async with running_stubs("a") as stubs:
        write_config(config, stubs)
        data = yaml.safe_load(config.read_text())
        data["server"]["rebalance_connections"] = True
        config.write_text(yaml.safe_dump(data))
        async with serve(config) as running:
            conns = [await asyncio.open_connection("127.0.0.1", running.port) for _ in range(40)]
            try:
                for _ in range(3):
                    assert {await keep_alive_request(r, w) for r, w in conns} == {b"HTTP/1.1 200 OK"}
                await asyncio.sleep(1.5)  # six rebalancing intervals
                samples = await running.metrics()  # on a connection of its own: one more on one worker
                held = per_worker(samples, "continuum_ingress_open_connections")
                assert sorted(held.values()) == [20, 21], held
                moved = per_worker(samples, "continuum_ingress_connections_moved_total", direction="out")
                taken = per_worker(samples, "continuum_ingress_connections_moved_total", direction="in")
                assert sum(moved.values()) == sum(taken.values())
                # every connection, moved or not, keeps serving
                for _ in range(2):
                    assert {await keep_alive_request(r, w) for r, w in conns} == {b"HTTP/1.1 200 OK"}
            finally:
                for _, writer in conns:
                    writer.close()


async def test_a_killed_worker_is_restarted_while_the_port_keeps_serving(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    async with running_stubs("a") as stubs:
        write_config(config, stubs)
        async with serve(config) as running, running.client() as client:
            before = running.workers()
            victim = min(before)
            os.kill(victim, signal.SIGKILL)
            # Reaped by the supervisor: every thread is gone, so its listening socket is closed
            # (a zombie leader can still have threads holding it, and connections queued there
            # are lost).
            await eventually(lambda: not Path(f"/proc/{victim}").exists(), limit=10)
            # The other worker takes every new connection meanwhile.
            replies = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(20)]
            assert [r.status_code for r in replies] == [200] * 20
            await eventually(lambda: len(running.workers()) == 2 and victim not in running.workers())

            async def restarted_and_serving() -> bool:
                samples = await running.metrics()
                restarts = per_worker(samples, "continuum_ingress_worker_restarts_total")
                up = per_worker(samples, "continuum_ingress_requests_total")  # every worker answered
                return sum(restarts.values()) == 1 and set(up) == {"0", "1"}

            await eventually(restarted_and_serving)
            assert running.proc.returncode is None


async def test_sighup_reloads_every_worker(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    async with running_stubs("a") as stubs:
        write_config(config, stubs)
        async with serve(config, "--watch-interval", "0") as running, running.client() as client:
            write_config(config, [], backends=stub_backends(stubs, models=["second"]))
            await asyncio.sleep(0.3)
            assert (await client.get("/v1/models")).json()["data"][0]["id"] == "m"  # only a signal reloads
            running.proc.send_signal(signal.SIGHUP)

            async def both_reloaded() -> bool:
                ok = per_worker(await running.metrics(), "continuum_config_reloads_total", result="ok")
                return ok == {"0": 1.0, "1": 1.0}

            await eventually(both_reloaded)
            models = {(await client.get("/v1/models")).json()["data"][0]["id"] for _ in range(10)}
            assert models == {"second"}


async def test_sigterm_drains_every_worker(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    async with running_stubs("a") as stubs:
        stubs[0].stub.hold = asyncio.Event()
        write_config(config, stubs)
        async with serve(config) as running, running.client() as client:
            workers = running.workers()
            held = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(6)]
            await eventually(lambda: stubs[0].stub.active == 6)
            running.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: not port_open(running.port), limit=10)  # no new connections
            await asyncio.sleep(0.5)
            assert running.proc.returncode is None  # still draining
            assert stubs[0].stub.hold is not None
            stubs[0].stub.hold.set()
            replies = await asyncio.gather(*held)
            assert [r.status_code for r in replies] == [200] * 6
            async with asyncio.timeout(30):
                assert await running.proc.wait() == 0
            await eventually(lambda: not any(process_alive(p) for p in workers), limit=10)


async def test_workers_die_with_their_supervisor(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    async with running_stubs("a") as stubs:
        write_config(config, stubs)
        async with serve(config) as running:
            workers = running.workers()
            argv = Path(f"/proc/{min(workers)}/cmdline").read_bytes().decode().split("\0")
            directory = Path(argv[argv.index("--worker-dir") + 1])
            running.proc.kill()
            await running.proc.wait()
            await eventually(lambda: not any(process_alive(p) for p in workers), limit=20)
            assert not port_open(running.port)
            # A killed supervisor cannot remove its directory; its workers drained and removed
            # their sockets on the way out.
            assert list(directory.iterdir()) == [directory / "metrics-supervisor.sock"]
            shutil.rmtree(directory)


async def test_a_worker_that_cannot_start_fails_serve_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    missing = tmp_path / "no-such-token"
    async with running_stubs("a") as stubs:
        write_config(config, stubs, admin={"token_file": str(missing)})
        code, out, err = await run_to_end(
            *ROUTER, "serve", "--config", str(config), "--port", "0", cwd=tmp_path, limit=90
        )
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(missing) in lines[0], err


async def test_a_port_in_use_fails_serve_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({"server": {"workers": 2}, "backends": []}))
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = await run_to_end(*ROUTER, "serve", "--config", str(config), "--port", str(port), cwd=tmp_path)
    assert (code, out) == (1, "")
    assert err.splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: address already in use"]


async def every_worker_sees(running: Serve, in_flight: int) -> bool:
    samples = await running.metrics()
    local = per_worker(samples, "continuum_prefix_routing_backend_distribution")
    remote = per_worker(samples, "continuum_backend_other_replicas_in_flight")
    return all(local.get(w, 0) + remote.get(w, 0) == in_flight for w in ("0", "1"))


def one_process_bound(requests: int, epsilon: float = 0.25) -> list[tuple[int, int]]:
    """What one process's CHWBL ring does with `requests` held requests of one prefix over two
    backends: (home, other) in flight after each."""
    home = other = 0
    out = []
    for _ in range(requests):
        bound = load_bound(home + other, 2, epsilon)
        if home < bound:
            home += 1
        elif other < bound:
            other += 1
        else:
            home += 1
        out.append((home, other))
    return out


@pytest.mark.parametrize("requests", [10])
async def test_the_chwbl_bound_holds_across_workers(tmp_path: Path, requests: int) -> None:
    """One hot prefix, two slow (held) backends, two workers: with the shared load view the
    in-flight sum per backend overflows to the second backend at the same totals as one process."""
    config = tmp_path / "router.yaml"
    async with running_stubs("a", "b") as stubs:
        for s in stubs:
            s.stub.hold = asyncio.Event()
        write_config(
            config,
            stubs,
            selection_strategy="PrefixAwareHash",
            prefix_routing={"enabled": True},
            load_sharing={"interval_ms": 20, "stale_after_ms": 2000},
        )
        async with serve(config) as running, running.client() as client:
            held: list[asyncio.Task[httpx.Response]] = []
            seen: list[tuple[int, int]] = []
            try:
                for _ in range(requests):
                    held.append(asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)))
                    await eventually(lambda: sum(s.stub.active for s in stubs) == len(held))
                    # Before the next request: every worker counts all k in flight (its own and
                    # the other's, as the other last reported them).
                    await eventually(lambda: every_worker_sees(running, len(held)))
                    seen.append((stubs[0].stub.active, stubs[1].stub.active))
                samples = await running.metrics()
                routed = per_worker(samples, "continuum_prefix_routing_requests_total")
            finally:
                for s in stubs:
                    assert s.stub.hold is not None
                    s.stub.hold.set()
                replies = await asyncio.gather(*held, return_exceptions=True)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in replies), replies
    # Both workers routed some of them (else the view was never needed).
    assert set(routed) == {"0", "1"} and all(n > 0 for n in routed.values()), routed
    home = 0 if seen[0][0] == 1 else 1
    assert [(counts[home], counts[1 - home]) for counts in seen] == one_process_bound(requests)
