"""`SimFleet`: start N simulated engines on free ports, for tests, demos and benchmarks.

    from continuum_sim import SimFleet

    async with SimFleet(3, time_scale=0.01) as fleet:
        fleet.urls                      # ["http://127.0.0.1:PORT", ...]  (OpenAI base = url + "/v1")
        e = fleet.endpoints[0]          # EngineEndpoints: url, openai_base_url, detokenize_url,
                                        #   kv_events_endpoint, replay_endpoint, topic, era, block_size...
        fleet.engines[0].pool           # in-process only: the SimEngine (block pool, scheduler, metrics)
        fleet.router_backends()         # `backends:` entries for a router config
        fleet.listener_sources()        # `sources:` entries for config.kv-listener.yaml

In-process (default) engines share the caller's event loop; `process=True` runs them in one child
process instead (`python -m continuum_sim --configs-json ...`), which uses another CPU core and
lets a test kill the engines like a crash would (`await fleet.kill()`). `process="each"` runs
every engine in a child process of its own, as real engines each have their own API server: a
slow request on one engine (a long `/tokenize`, say) then no longer delays the others.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import zmq.asyncio

from continuum_common.children import bound_to_parent, spawn_options
from continuum_common.procs import stop_process
from continuum_sim.app import EngineEndpoints, SimEngineServer, start_servers, stop_servers, write_info
from continuum_sim.config import EngineConfig, config_to_dict
from continuum_sim.engine import SimEngine
from continuum_sim.errors import SimError
from continuum_sim.protocol.kv_wire import Era


def fleet_configs(
    count: int,
    config: EngineConfig | None = None,
    *,
    name_prefix: str = "sim",
    time_scale: float | None = None,
    era: Era | None = None,
) -> list[EngineConfig]:
    """`count` copies of `config` named PREFIX-i, each on free HTTP/ZMQ ports (bind mode)."""
    base = config or EngineConfig()
    if time_scale is not None:
        base = replace(base, timing=replace(base.timing, time_scale=time_scale))
    if era is not None:
        base = replace(base, kv_events=replace(base.kv_events, era=era))
    kv = base.kv_events
    if kv.zmq_mode == "connect" and count > 1:
        raise SimError("connect-mode engines need one endpoint each: pass `configs=` instead")
    if kv.zmq_mode == "bind":
        host = kv.endpoint.rsplit(":", 1)[0] if kv.endpoint.startswith("tcp://") else "tcp://127.0.0.1"
        kv = replace(kv, endpoint=f"{host}:0", replay_endpoint=f"{host}:0" if kv.replay_endpoint else None)
    return [replace(base, name=f"{name_prefix}-{i}", port=0, kv_events=kv) for i in range(count)]


def router_backends(endpoints: Sequence[EngineEndpoints], backend_type: str = "vllm") -> list[dict[str, Any]]:
    """`backends:` entries of a router configuration for these engines."""
    return [{"name": e.name, "url": e.url, "type": backend_type, "models": [e.model]} for e in endpoints]


def listener_sources(endpoints: Sequence[EngineEndpoints]) -> list[dict[str, Any]]:
    """`sources:` entries of config.kv-listener.yaml: the listener's ZMQ mode is the opposite
    of the engine's (an engine that binds is dialled, one that connects is listened for)."""
    out: list[dict[str, Any]] = []
    for e in endpoints:
        if e.kv_events_endpoint is None:
            continue
        source: dict[str, Any] = {
            "backend_name": e.name,
            "engine": "sglang" if e.era == "sglang" else "vllm",
            "zmq_endpoint": e.kv_events_endpoint,
            "zmq_mode": "connect" if e.zmq_mode == "bind" else "bind",
            "topic": e.topic,
            "detokenize_endpoint": e.detokenize_url,
            "model": e.model,
            "chat_template": "chatml",
            "block_size": e.block_size,
        }
        if e.replay_endpoint:
            source["replay_endpoint"] = e.replay_endpoint
        out.append(source)
    return out


class SimFleet:
    def __init__(
        self,
        count: int = 1,
        *,
        config: EngineConfig | None = None,
        configs: Sequence[EngineConfig] | None = None,
        time_scale: float | None = None,
        era: Era | None = None,
        name_prefix: str = "sim",
        process: bool | Literal["each"] = False,
        startup_timeout: float = 30.0,
    ) -> None:
        if configs is not None:
            self.configs = list(configs)
        else:
            self.configs = fleet_configs(count, config, name_prefix=name_prefix, time_scale=time_scale, era=era)
        if not self.configs:
            raise SimError("a fleet needs at least one engine")
        self.process = process
        self.startup_timeout = startup_timeout
        self.endpoints: list[EngineEndpoints] = []
        self._servers: list[SimEngineServer] = []
        self._context: zmq.asyncio.Context | None = None
        self._children: list[asyncio.subprocess.Process] = []
        self._tmp: Path | None = None

    # -- what callers use --------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.endpoints]

    @property
    def engines(self) -> list[SimEngine]:
        """The engine objects (in-process fleets only; empty for `process=True`)."""
        return [s.engine for s in self._servers]

    @property
    def pid(self) -> int | None:
        """The first child's pid (process fleets) — e.g. to sample its memory."""
        return self._children[0].pid if self._children else None

    @property
    def pids(self) -> list[int]:
        """Every child's pid (one, or one per engine with `process="each"`; none in-process)."""
        return [child.pid for child in self._children]

    def router_backends(self, backend_type: str = "vllm") -> list[dict[str, Any]]:
        return router_backends(self.endpoints, backend_type)

    def listener_sources(self) -> list[dict[str, Any]]:
        return listener_sources(self.endpoints)

    def write_info(self, path: str | Path) -> None:
        write_info(path, self.endpoints, self.pids or None)

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        if self.process:
            await self._start_process()
            return
        self._context = zmq.asyncio.Context()
        try:
            self._servers = await start_servers(self.configs, self._context)
        except BaseException:
            self._context.destroy(linger=0)
            self._context = None
            raise
        self.endpoints = [s.endpoints for s in self._servers]

    async def close(self) -> None:
        if self._servers:
            await stop_servers(self._servers)
            self._servers = []
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None
        if self._children:
            await self._stop_children(signal.SIGTERM)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    async def kill(self) -> None:
        """SIGKILL the child processes (process fleets): the engines vanish as in a crash."""
        if not self._children:
            raise SimError("kill() needs a process fleet")
        await self._stop_children(signal.SIGKILL)

    async def _start_process(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="continuum-sim-"))
        groups = [[c] for c in self.configs] if self.process == "each" else [self.configs]
        try:
            infos = [await self._spawn(i, group) for i, group in enumerate(groups)]
            deadline = time.monotonic() + self.startup_timeout
            # The children start together; the slowest one sets the pace.
            for i in range(len(infos)):
                await self._wait_info(i, deadline)
        except BaseException:
            await self.close()
            raise
        self.endpoints = [
            EngineEndpoints.from_dict(item) for info in infos for item in json.loads(info.read_text())["engines"]
        ]

    async def _spawn(self, index: int, configs: Sequence[EngineConfig]) -> Path:
        assert self._tmp is not None
        configs_file, info_file = self._tmp / f"configs-{index}.json", self._tmp / f"info-{index}.json"
        configs_file.write_text(json.dumps([config_to_dict(c) for c in configs]))
        log = (self._tmp / f"engines-{index}.log").open("wb")
        try:
            # The engines stop when this process dies, even by SIGKILL (continuum_common.children).
            argv = [sys.executable, "-m", "continuum_sim", "--configs-json", str(configs_file)]
            argv += ["--info-file", str(info_file)]
            child = await asyncio.create_subprocess_exec(
                *bound_to_parent(argv),
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT, **spawn_options(),
            )  # fmt: skip
        finally:
            log.close()
        self._children.append(child)
        return info_file

    async def _wait_info(self, index: int, deadline: float) -> None:
        assert self._tmp is not None
        child, info_file = self._children[index], self._tmp / f"info-{index}.json"
        while not info_file.exists():
            if child.returncode is not None or time.monotonic() > deadline:
                tail = (self._tmp / f"engines-{index}.log").read_text(errors="replace")[-2000:]
                raise SimError(f"simulated engines did not start:\n{tail}")
            await asyncio.sleep(0.05)

    async def _stop_children(self, sig: int) -> None:
        children, self._children = self._children, []
        await asyncio.gather(*(stop_process(child, sig, grace=10.0) for child in children))
