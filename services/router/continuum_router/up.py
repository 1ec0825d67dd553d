"""`continuum-router up`: the embedded default of DESIGN.md §7 on one machine.

Takes the state directory `.continuum/` (statelock.py: one `up` per directory, leftovers of a
dead one stopped) and the ingress's port, then starts the embedded `nats-server -js` (when
`bus.embedded`, the default) with its store under `.continuum/` (or `bus.data_dir`), then every
service in SERVICES in order, and stops them in reverse order on SIGINT/SIGTERM. SIGHUP reloads
the router configuration, unless the terminal is gone (hangup.py): then `up` stops. `--demo`
first starts three simulated vLLM engines (continuum_sim.SimFleet, in a child process) and
writes a config pointing at them to `.continuum/demo-config.yaml` (edit it: hot reload picks
changes up). Child processes run in sessions of their own and get SIGTERM when `up` dies, even
by SIGKILL (continuum_common.children).

SERVICES is the registry of what runs: the KV listener (with `--listener-config FILE`, or the
file `--demo` generates), the indexer (with `kv_cache_index.backend: redis`; with `memory` the
ingress holds the index itself), gemini-cache (with `gemini_context_cache.enabled`) and the ingress. Each
`Service.run()` gets the UpContext (config, NATS URL, data directory). See kv.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from continuum_common.asgi_server import bind_tcp
from continuum_common.config import RouterConfig, load_router_config
from continuum_common.errors import ConfigError, ListenError
from continuum_common.procs import NatsServer
from continuum_ingress.server import RunningServer
from continuum_router.compose import build_ingress
from continuum_router.demo import banner as demo_banner
from continuum_router.demo import demo_config, demo_fleet, demo_model
from continuum_router.hangup import TerminalWatch, detach_std_streams
from continuum_router.kv import (
    ADMIN_TOKEN_FILE,
    demo_kv_sections,
    demo_listener_config,
    indexer_service,
    listener_service,
)
from continuum_router.run import install_stop_signals
from continuum_router.statelock import StateLock, holding
from continuum_router.topology import load_plan_inputs, plan, run_multi
from continuum_sim import SimFleet

log = logging.getLogger(__name__)

STATE_DIR = Path(".continuum")
HANGUP_LOG = "up-after-hangup.log"  # in the state directory: the output once the terminal is gone
DEMO_PORT = 8080
# After a SIGHUP taken for a reload, look at the terminal once more: the hang-up that closes a
# terminal also ends the other processes of the pipeline `up` writes to, a moment later.
HANGUP_RECHECK_S = 0.5
LISTEN_BACKLOG = 2048


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
    # The ingress's socket, bound (and listening) before any process was started.
    listen_socket: socket.socket | None = None
    # What a SIGHUP reload calls (services append to it).
    reloaders: list[Callable[[], object]] = field(default_factory=list)
    # Records child processes (`add_child(name, pid)`) so the next `up` can stop them if this
    # one dies without doing so.
    state_lock: StateLock | None = None


@dataclass(frozen=True)
class Service:
    name: str
    # Runs the service until the context exits; yields a one-line description (e.g. its URL),
    # or None when the configuration does not call for it (it is then not listed).
    run: Callable[[UpContext], AbstractAsyncContextManager[str | None]]


@contextlib.asynccontextmanager
async def _ingress(ctx: UpContext) -> AsyncIterator[str | None]:
    app = build_ingress(ctx.config_path, nats_url=ctx.nats_url)
    server_cfg = ctx.config.server
    if server_cfg.workers > 1:
        log.warning("server.workers=%d applies to `serve`; `up` runs one ingress process", server_cfg.workers)
    host = ctx.host or server_cfg.host
    port = server_cfg.port if ctx.port is None else ctx.port
    async with RunningServer(app.asgi, host, port, sock=ctx.listen_socket, edge=app.edge) as server:
        ctx.reloaders.append(app.reload)
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
async def _nats(config: RouterConfig, data_dir: Path, lock: StateLock) -> AsyncIterator[str | None]:
    if not config.bus.embedded:
        yield config.bus.url
        return
    nats_dir = Path(config.bus.data_dir) if config.bus.data_dir else data_dir / "nats"
    server = NatsServer(data_dir=nats_dir, port=config.bus.embedded_port)
    await server.start()
    lock.add_child("nats-server", server.pid)
    log.info("embedded nats-server (JetStream) on %s, store in %s", server.url, nats_dir)
    try:
        yield server.url
    finally:
        await server.stop()


def _listen(config: RouterConfig | None, host: str | None, port: int | None) -> socket.socket:
    """The ingress's socket, taken first so a port in use stops `up` before it starts anything.
    `--demo` without a config: 8080 when it is free, else any free port (the banner prints the
    URL either way)."""
    if config is not None:
        return bind_tcp(
            host or config.server.host, config.server.port if port is None else port, backlog=LISTEN_BACKLOG
        )
    bind_host = host or "127.0.0.1"
    if port is not None:
        return bind_tcp(bind_host, port, backlog=LISTEN_BACKLOG)
    try:
        return bind_tcp(bind_host, DEMO_PORT, backlog=LISTEN_BACKLOG)
    except ListenError:
        return bind_tcp(bind_host, 0, backlog=LISTEN_BACKLOG)


def _install_signals(stop: asyncio.Event, reloaders: list[Callable[[], object]], state_dir: Path) -> None:
    """SIGINT/SIGTERM stop; SIGHUP reloads, or stops when the terminal is gone (hangup.py):
    the output then goes to HANGUP_LOG in the state directory."""
    watch = TerminalWatch()  # before our handler replaces a SIGHUP that nohup set to ignore
    loop = asyncio.get_running_loop()
    install_stop_signals(stop)

    def terminal_gone() -> bool:
        if not watch.lost():
            return False
        # nobody reads the terminal any more: the shutdown must not fail writing, and what it
        # says (an error included) is kept for whoever closed the terminal
        detach_std_streams(state_dir / HANGUP_LOG)
        log.warning("the terminal is gone (SIGHUP): stopping")
        stop.set()
        return True

    def on_sighup() -> None:
        if terminal_gone():
            return
        log.info("SIGHUP: reloading the configuration")
        for reload in reloaders:
            reload()
        loop.call_later(HANGUP_RECHECK_S, terminal_gone)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)


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
    topology: str = "single",
    replicas: int = 2,
) -> None:
    """Run until `stop` is set (SIGINT/SIGTERM, or a lost terminal, when `on_ready` is None: the
    command line; tests pass `on_ready` and set `stop` themselves)."""
    if config_path is None and not demo:
        raise ConfigError("up needs --config FILE (or CONTINUUM_CONFIG), or --demo")
    if topology not in ("single", "multi") or not 1 <= replicas <= 64:
        raise ConfigError("up: --topology single|multi, --replicas 1..64")
    # A bad or unreadable file fails here, before anything starts.
    given = load_router_config(config_path) if config_path is not None else None
    stop = stop or asyncio.Event()
    reloaders: list[Callable[[], object]] = []
    if on_ready is None:
        _install_signals(stop, reloaders, state_dir)
    _make_dir(state_dir)
    async with contextlib.AsyncExitStack() as stack:
        lock = await stack.enter_async_context(holding(state_dir))
        listen_socket = _listen(given, host, port)
        stack.callback(listen_socket.close)
        fleet = await stack.enter_async_context(demo_fleet()) if demo else None
        if fleet is not None:
            lock.add_child("simulated engines", fleet.pid)
        path = Path(config_path) if config_path is not None else _write_demo_config(state_dir, fleet, listen_socket)
        config = given if given is not None else load_router_config(path)
        nats_url = await stack.enter_async_context(_nats(config, state_dir, lock))
        listener_path = Path(listener_config) if listener_config else None
        ctx = UpContext(
            path, config, nats_url, state_dir, host, port, fleet, listener_path, listen_socket, reloaders, lock
        )
        if topology == "multi":
            described = await _start_multi(stack, ctx, replicas)
        else:
            described = await _start_services(stack, ctx, stop)
        if stop.is_set():
            return
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


def _write_demo_config(state_dir: Path, fleet: SimFleet | None, listen_socket: socket.socket) -> Path:
    assert fleet is not None
    bind_host, bind_port = listen_socket.getsockname()[:2]
    data = demo_config(fleet.router_backends(), host=bind_host, port=bind_port)
    e0 = fleet.endpoints[0]
    data.update(demo_kv_sections(state_dir, model=e0.model, block_size=e0.block_size, hash_seed=e0.python_hash_seed))
    return _write_yaml(state_dir / "demo-config.yaml", data)


async def _start_multi(stack: contextlib.AsyncExitStack, ctx: UpContext, replicas: int) -> dict[str, str]:
    """--topology multi (topology.py): every service a process of its own."""
    assert ctx.nats_url is not None and ctx.listen_socket is not None
    router, listener = load_plan_inputs(ctx.config_path, ctx.listener_config)
    if listener is None and ctx.fleet is not None:
        listener = demo_listener_config(ctx.fleet.listener_sources(), nats_url=ctx.nats_url)
    host, port = ctx.listen_socket.getsockname()[:2]
    # The router's processes bind the port themselves (SO_REUSEPORT): let go of it.
    ctx.listen_socket.close()
    multi = plan(router, nats_url=ctx.nats_url, port=port, host=host, replicas=replicas, listener=listener)
    assert ctx.state_lock is not None
    return await run_multi(stack, multi, state_dir=ctx.data_dir, lock=ctx.state_lock, reloaders=ctx.reloaders)


async def _start_services(stack: contextlib.AsyncExitStack, ctx: UpContext, stop: asyncio.Event) -> dict[str, str]:
    """Start SERVICES in order (each stopped by `stack`, in reverse); a stop request between two
    services ends the start-up early."""
    described: dict[str, str] = {}
    for service in SERVICES:
        if stop.is_set():
            break
        description = await stack.enter_async_context(service.run(ctx))
        if description is not None:
            described[service.name] = description
            log.info("%s: %s", service.name, description)
    return described
