"""`continuum-router up`: the embedded default of DESIGN.md §7 on one machine.

Starts the embedded `nats-server -js` (when `bus.embedded`, the default) with its store under
`.continuum/` (or `bus.data_dir`), then every service in SERVICES in order, and stops them in
reverse order on SIGINT/SIGTERM. `--demo` first starts three simulated vLLM engines
(continuum_sim.SimFleet, in a child process) and writes a config pointing at them to
`.continuum/demo-config.yaml` (edit it: hot reload picks changes up).

SERVICES is the registry of what runs: the KV listener (with `--listener-config FILE`, or the
file `--demo` generates), the indexer (with `kv_cache_index.backend: redis`; with `memory` the
ingress holds the index itself), gemini-cache (with `gemini_context_cache.enabled`) and the ingress. Each
`Service.run()` gets the UpContext (config, NATS URL, data directory). See kv/up.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from continuum_common.config import RouterConfig, load_router_config
from continuum_common.errors import ConfigError
from continuum_common.procs import NatsServer
from continuum_ingress.app import IngressApp
from continuum_ingress.demo import banner as demo_banner
from continuum_ingress.demo import demo_config, demo_fleet, demo_model
from continuum_ingress.kv.up import ADMIN_TOKEN_FILE, demo_kv_sections, indexer_service, listener_service
from continuum_ingress.run import install_stop_signals
from continuum_ingress.server import RunningServer
from continuum_sim import SimFleet

log = logging.getLogger(__name__)

STATE_DIR = Path(".continuum")
DEMO_PORT = 8080


@dataclass(frozen=True)
class UpContext:
    config_path: Path
    config: RouterConfig
    nats_url: str | None
    data_dir: Path
    host: str | None = None
    port: int | None = None
    # With --demo: the simulated engines (`fleet.endpoints`, `fleet.listener_sources()` for the
    # KV listener's `sources:`).
    fleet: SimFleet | None = None
    # The KV listener's own file (`--listener-config`); None: no listener (unless --demo).
    listener_config: Path | None = None


@dataclass(frozen=True)
class Service:
    name: str
    # Runs the service until the context exits; yields a one-line description (e.g. its URL),
    # or None when the configuration does not call for it (it is then not listed).
    run: Callable[[UpContext], AbstractAsyncContextManager[str | None]]


@contextlib.asynccontextmanager
async def _ingress(ctx: UpContext) -> AsyncIterator[str | None]:
    app = IngressApp(ctx.config_path, nats_url=ctx.nats_url)
    server_cfg = ctx.config.server
    host = ctx.host or server_cfg.host
    port = server_cfg.port if ctx.port is None else ctx.port
    async with RunningServer(app.asgi, host, port, edge=app.edge) as server:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            import signal

            loop.add_signal_handler(signal.SIGHUP, app.reload)
        yield server.url


@contextlib.asynccontextmanager
async def _gemini_cache(ctx: UpContext) -> AsyncIterator[str | None]:
    """The gemini-cache service in this process (memory state, or Redis when configured), only
    with gemini_context_cache.enabled."""
    if not ctx.config.gemini_context_cache.enabled:
        yield None
        return
    from continuum_gemini_cache.app import GeminiCacheApp

    app = GeminiCacheApp(ctx.config, source=str(ctx.config_path), nats_url=ctx.nats_url)
    await app.start()
    try:
        yield f"{len(app.settings.backends)} gemini backend(s), state: {app.store.kind}"
    finally:
        await app.stop()


# The services `up` runs, in start order (stopped in reverse); gemini-cache before the ingress,
# so the ingress's first lookups find it.
SERVICES: tuple[Service, ...] = (
    Service("listener", listener_service),
    Service("indexer", indexer_service),
    Service("gemini-cache", _gemini_cache),
    Service("ingress", _ingress),
)


@contextlib.asynccontextmanager
async def _nats(config: RouterConfig, data_dir: Path) -> AsyncIterator[str | None]:
    if not config.bus.embedded:
        yield config.bus.url
        return
    nats_dir = Path(config.bus.data_dir) if config.bus.data_dir else data_dir / "nats"
    server = NatsServer(data_dir=nats_dir, port=config.bus.embedded_port)
    await server.start()
    log.info("embedded nats-server (JetStream) on %s, store in %s", server.url, nats_dir)
    try:
        yield server.url
    finally:
        await server.stop()


def _demo_port(host: str) -> int:
    """8080 when it is free, else any free port (the banner prints the URL either way)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, DEMO_PORT))
        except OSError:
            return 0
    return DEMO_PORT


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


async def up(
    config_path: str | None,
    *,
    demo: bool = False,
    host: str | None = None,
    port: int | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
    state_dir: Path = STATE_DIR,
    listener_config: str | None = None,
) -> None:
    if config_path is None and not demo:
        raise ConfigError("up needs --config FILE (or CONTINUUM_CONFIG), or --demo")
    stop = stop or asyncio.Event()
    if on_ready is None:
        install_stop_signals(stop)
    _make_dir(state_dir)
    async with contextlib.AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(demo_fleet()) if demo else None
        if config_path is None:
            assert fleet is not None
            bind_host = host or "127.0.0.1"
            data = demo_config(
                fleet.router_backends(), host=bind_host, port=_demo_port(bind_host) if port is None else port
            )
            e0 = fleet.endpoints[0]
            data.update(
                demo_kv_sections(state_dir, model=e0.model, block_size=e0.block_size, hash_seed=e0.python_hash_seed)
            )
            path = _write_yaml(state_dir / "demo-config.yaml", data)
        else:
            path = Path(config_path)
        config = load_router_config(path)
        nats_url = await stack.enter_async_context(_nats(config, state_dir))
        listener_path = Path(listener_config) if listener_config else None
        ctx = UpContext(path, config, nats_url, state_dir, host, port, fleet, listener_path)
        described: dict[str, str] = {}
        for service in SERVICES:
            description = await stack.enter_async_context(service.run(ctx))
            if description is not None:
                described[service.name] = description
                log.info("%s: %s", service.name, description)
        url = described["ingress"]
        if on_ready is not None:
            on_ready(url)
        else:
            model = demo_model(fleet) if fleet is not None else None
            engines = len(fleet.endpoints) if fleet is not None else 0
            token = str(state_dir / ADMIN_TOKEN_FILE) if fleet is not None else None
            banner = demo_banner(url, model=model, engines=engines, services=list(described), admin_token_file=token)
            print(banner, flush=True)
        await stop.wait()
        log.info("stopping: %s", ", ".join(reversed(described)))
