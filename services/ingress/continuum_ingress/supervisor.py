"""`continuum-router serve` with `server.workers: N` (N > 1): one supervisor, N worker processes
on one port, so one `serve` uses every core.

The supervisor
* takes host:port (port 0: a free one) once, without listening (`hold_tcp_port`), and holds it
  until it exits, so the port stays this serve's while a worker restarts;
* creates a private directory (mode 0700) for the workers' sockets (workers.py) and serves its
  own metrics there;
* starts N copies of `serve` with the resolved host and port and a worker seat; each listens on
  the port with SO_REUSEPORT and the kernel spreads new connections over the listening workers;
* prints `continuum-router listening on URL (N workers)` once every worker listens;
* restarts a worker that dies after a backoff (policy/restarts.py), logged and counted in
  `continuum_ingress_worker_restarts_total{worker}`;
* forwards SIGHUP (reload) to every worker, turns SIGTERM / SIGINT into a drain of all of them,
  and exits once they are gone (workers still running after DRAIN_LIMIT_S are killed).

Workers get SIGTERM (a drain) when the supervisor dies, even by SIGKILL. A worker that fails
before every worker listened fails the whole serve with its one-line error.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from continuum_common.asgi_server import hold_tcp_port
from continuum_common.errors import ContinuumError
from continuum_ingress.adapters.worker_metrics import close_exposition, serve_exposition
from continuum_ingress.adapters.worker_process import WorkerProcess, describe_exit
from continuum_ingress.metrics import SupervisorMetrics
from continuum_ingress.policy.restarts import ExitVerdict, RestartBackoff, after_exit
from continuum_ingress.workers import SUPERVISOR, WorkerSeat

log = logging.getLogger("continuum.ingress.supervisor")

# Longer than a worker's own drain (uvicorn's 30 s graceful shutdown) plus its components' close.
DRAIN_LIMIT_S = 45.0
# Unix socket paths are limited to 108 bytes; a long TMPDIR falls back to /tmp.
MAX_SOCKET_DIR_CHARS = 64


class WorkerStartError(ContinuumError):
    """A worker could not start (its own one-line error, or how it exited)."""


class Supervisor:
    def __init__(self, serve_argv: Sequence[str], host: str, port: int, workers: int) -> None:
        """`serve_argv`: the command that runs `serve` (with --config and other options), to
        which each worker's --host, --port and seat are appended."""
        self.serve_argv = list(serve_argv)
        self.host = host
        self.port = port
        self.count = workers
        self.workers: dict[int, WorkerProcess] = {}
        self.metrics = SupervisorMetrics(lambda: float(sum(w.running for w in self.workers.values())))
        self.serving = False
        self.stopping = False
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._failure: str | None = None
        self._killed = False
        self._restarts: dict[int, int] = {}

    async def run(self) -> int:
        """Serve until SIGTERM / SIGINT; raises ListenError or WorkerStartError at start-up."""
        sock = hold_tcp_port(self.host, self.port)
        self.port = sock.getsockname()[1]
        directory = Path(tempfile.mkdtemp(prefix="continuum-serve-", dir=_socket_dir()))
        metrics_path = directory / f"metrics-{SUPERVISOR}.sock"
        try:
            metrics_server = await serve_exposition(metrics_path, self.metrics.registry)
            try:
                await self._supervise(directory)
            finally:
                await close_exposition(metrics_server, metrics_path)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            sock.close()
        return 1 if self._killed else 0

    async def _supervise(self, directory: Path) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        keepers = [
            loop.create_task(self._keep(WorkerSeat(directory, i, self.count)), name=f"keep-worker-{i}")
            for i in range(self.count)
        ]
        try:
            await self._started()
            if self._failure is not None:
                await self._drain(keepers)
                raise WorkerStartError(self._failure)
            if not self.stopping:
                log.info("%d workers serving on %s", self.count, self.url)
                print(f"continuum-router listening on {self.url} ({self.count} workers)", flush=True)
                await self._stop.wait()
                log.info("shutting down: draining every worker")
            await self._drain(keepers)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            for task in keepers:
                task.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
            for worker in self.workers.values():  # cancelled with workers left: none outlives this
                worker.send(signal.SIGKILL)

    @property
    def url(self) -> str:
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # ---- signals ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            self._stop.set()
            self._changed.set()
        for worker in self.workers.values():
            worker.send(signal.SIGTERM)

    def reload(self) -> None:
        """Every worker that serves reloads; one still starting reads the file as it starts (a
        SIGHUP before its handler is installed would end it)."""
        ready = [w for w in self.workers.values() if w.ready and w.running]
        log.info("SIGHUP: reloading %d worker(s)", len(ready))
        for worker in ready:
            worker.send(signal.SIGHUP)

    # ---- workers ---------------------------------------------------------------------------

    async def _started(self) -> None:
        """Until every worker listens, one fails, or a stop is asked for."""
        while not (self.stopping or self._failure is not None or self._all_ready()):
            await self._changed.wait()
            self._changed.clear()
        self.serving = self._failure is None and not self.stopping

    def _all_ready(self) -> bool:
        return len(self.workers) == self.count and all(w.ready for w in self.workers.values())

    def _argv(self, seat: WorkerSeat) -> list[str]:
        return [*self.serve_argv, "--host", self.host, "--port", str(self.port), *seat.argv()]

    async def _keep(self, seat: WorkerSeat) -> None:
        """Run worker `seat.index` until the supervisor stops, restarting it when it dies."""
        backoff = RestartBackoff()
        while True:
            worker = WorkerProcess(seat.index, self._argv(seat), on_ready=lambda _w: self._changed.set())
            self.workers[seat.index] = worker
            await worker.start()
            if self.stopping:  # asked to stop while this one was being started
                worker.send(signal.SIGTERM)
            code = await worker.wait()
            verdict = after_exit(stopping=self.stopping, serving=self.serving)
            if verdict is ExitVerdict.DONE:
                return
            if verdict is ExitVerdict.FAIL:
                self._failure = worker.error or f"worker {seat.index} exited with {describe_exit(code)} during start-up"
                self._changed.set()
                return
            ran_for = worker.ran_for()
            delay = backoff.next_delay(ran_for)
            self.metrics.restarts.labels(str(seat.index)).inc()
            restarts = self._restarts[seat.index] = self._restarts.get(seat.index, 0) + 1
            log.warning(
                "worker %d (pid %s) exited with %s after %.1f s; restarting it in %.1f s (restart %d of this worker)",
                seat.index, worker.pid, describe_exit(code), ran_for, delay, restarts,
            )  # fmt: skip
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
                return
            except TimeoutError:
                pass

    async def _drain(self, keepers: Sequence[asyncio.Task[None]]) -> None:
        self.stopping = True
        for worker in self.workers.values():
            worker.send(signal.SIGTERM)
        self._stop.set()
        if not keepers:
            return
        _done, pending = await asyncio.wait(keepers, timeout=DRAIN_LIMIT_S)
        if pending:
            self._killed = True
            log.warning("workers still running %.0f s after SIGTERM: killing them", DRAIN_LIMIT_S)
            for worker in self.workers.values():
                worker.send(signal.SIGKILL)
            await asyncio.gather(*pending, return_exceptions=True)


def _socket_dir() -> str | None:
    default = tempfile.gettempdir()
    if len(default) <= MAX_SOCKET_DIR_CHARS or sys.platform == "win32":
        return None
    return "/tmp"
