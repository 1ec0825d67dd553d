"""Process-level runners: the event loop (uvloop), signals, and `continuum-router serve`."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from continuum_ingress.app import IngressApp
from continuum_ingress.server import RunningServer

log = logging.getLogger(__name__)
T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on uvloop (the asyncio default loop where uvloop is unavailable)."""
    factory = None
    if sys.platform != "win32":
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
            factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def serve_forever(
    config_path: str | Path, host: str | None = None, port: int | None = None, watch_interval: float = 1.0
) -> None:
    """`continuum-router serve`: one ingress process until SIGINT/SIGTERM; SIGHUP reloads."""
    app = IngressApp(config_path, reload_interval=watch_interval)
    server_cfg = app.holder.current.config.server
    if server_cfg.workers > 1:
        log.warning(
            "server.workers=%d: this process serves alone; run one `serve` per core behind a load balancer",
            server_cfg.workers,
        )
    stop = asyncio.Event()
    install_stop_signals(stop)
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, app.reload)
    bind_host = host or server_cfg.host
    bind_port = server_cfg.port if port is None else port
    async with RunningServer(app.asgi, bind_host, bind_port, log_level="warning", edge=app.edge) as server:
        log.info("continuum-router serving on %s (SIGHUP or a file change reloads %s)", server.url, config_path)
        print(f"continuum-router listening on {server.url}", flush=True)
        await stop.wait()
        log.info("shutting down: draining requests in flight")
