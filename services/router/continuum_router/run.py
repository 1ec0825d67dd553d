"""Process-level runners: signals and `continuum-router serve` (one
process, a worker, or the supervisor of `server.workers` workers)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from continuum_common.asgi_server import bind_tcp
from continuum_common.config import load_router_config
from continuum_common.runner import settle_heap
from continuum_ingress.metrics import RebalanceMetrics
from continuum_ingress.rebalancer import ConnectionBalancer
from continuum_ingress.server import RunningServer
from continuum_ingress.supervisor import Supervisor
from continuum_ingress.workers import WorkerSeat
from continuum_router.compose import build_ingress

log = logging.getLogger(__name__)


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def serve_forever(
    config_path: str | Path,
    host: str | None = None,
    port: int | None = None,
    watch_interval: float = 1.0,
    *,
    worker: WorkerSeat | None = None,
    log_level: str | None = None,
) -> int:
    """`continuum-router serve`: one ingress process until SIGINT/SIGTERM; SIGHUP reloads. With
    `server.workers` > 1 this process becomes the supervisor of that many workers
    (continuum_ingress.supervisor); `worker` makes it one of them. Returns the exit code."""
    if worker is None:
        server_cfg = load_router_config(config_path).server
        if server_cfg.workers > 1:
            supervisor = Supervisor(
                _serve_argv(config_path, watch_interval, log_level),
                host or server_cfg.host,
                server_cfg.port if port is None else port,
                server_cfg.workers,
            )
            return await supervisor.run()
    app = build_ingress(config_path, reload_interval=watch_interval, worker=worker)
    server_cfg = app.holder.current.config.server
    stop = asyncio.Event()
    install_stop_signals(stop)
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, app.reload)
    bind_host = host or server_cfg.host
    bind_port = server_cfg.port if port is None else port
    # A worker shares its supervisor's port with its siblings (SO_REUSEPORT).
    sock = None if worker is None else bind_tcp(bind_host, bind_port, reuse_port=True)
    async with RunningServer(app.asgi, bind_host, bind_port, log_level="warning", edge=app.edge, sock=sock) as server:
        log.info("continuum-router serving on %s (SIGHUP or a file change reloads %s)", server.url, config_path)
        balancer = None
        if worker is not None and server_cfg.rebalance_connections:
            metrics = RebalanceMetrics(app.metrics.registry)
            balancer = ConnectionBalancer(worker, server, metrics, interval=server_cfg.rebalance_interval)
        settle_heap()
        print(f"continuum-router listening on {server.url}", flush=True)
        async with asyncio.TaskGroup() as tasks:
            if balancer is not None:
                tasks.create_task(balancer.run(), name="connection-balancer")
            await stop.wait()
            if balancer is not None:
                balancer.stop()  # before the drain: a stopping worker neither gives nor takes
        log.info("shutting down: draining requests in flight")
    return 0


def _serve_argv(config_path: str | Path, watch_interval: float, log_level: str | None) -> list[str]:
    """The command a supervisor runs for each worker (the worker's seat, host and port follow)."""
    argv = [sys.executable, "-m", "continuum_router", "serve", "--config", str(config_path)]
    argv += ["--watch-interval", repr(watch_interval)]
    if log_level:
        argv += ["--log-level", log_level]
    return argv
