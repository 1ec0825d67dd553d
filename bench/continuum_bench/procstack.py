"""A whole Continuum stack as separate OS processes on loopback, for fault drills and soak runs.

    async with ProcessStack(tmp_dir, engines=3, indexers=2) as stack:
        stack.router.url            # continuum-router serve (response cache + KV index on Redis)
        await stack.engines[0].kill()   # SIGKILL, as a crash would
        await stack.engines[0].start()  # same ports, a new incarnation (its seq starts again)

Every service is the real console entry point in its own process group: `nats-server -js`,
`redis-server`, simulated vLLM engines (one process each, fixed ports, KV events on ZMQ with a
replay socket), the KV listener (`publish: blocks`), `indexers` indexer replicas on one durable
consumer, and the router. Ports are chosen once, so a restarted process comes back where it was.
Logs stay in the stack's directory (`<name>.log`); `tail(name)` shows the end of one.

`Load` drives the router at a steady rate and reports what was lost (`LoadReport`); it is the
measure of every fault drill (tests/faults) and of `python -m continuum_bench.soak`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from continuum_common.procs import HttpServiceProcess, ManagedProcess, NatsServer, RedisServer, free_port, port_is_free
from continuum_sim.app import EngineEndpoints
from continuum_sim.fleet import listener_sources

MODEL = "continuum-sim-8b"
ADMIN_TOKEN = "fault-drill-admin-token"


class ServiceProcess(HttpServiceProcess):
    """One service of the stack (continuum_common.procs.HttpServiceProcess) plus what the
    drills need: its pid and resident memory."""

    def rss_bytes(self) -> int | None:
        return rss_bytes(self.pid)


def rss_bytes(pid: int | None) -> int | None:
    """Resident set size of a process (Linux /proc), None when it is gone."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


@dataclass
class StackOptions:
    engines: int = 3
    indexers: int = 2
    # Engine replay buffer (batches); small values let a drill outrun it.
    buffer_steps: int = 10_000
    # Simulated engine speed: real seconds per simulated second (1.0: vLLM-like timings).
    time_scale: float = 0.05
    num_gpu_blocks: int = 4096
    response_cache: bool = True
    stream_idle_timeout_ms: int = 60_000
    first_byte_timeout_ms: int = 60_000
    health_check_interval_ms: int = 500
    log_level: str = "INFO"


class ProcessStack:
    def __init__(self, root: Path, options: StackOptions | None = None) -> None:
        self.root = Path(root)
        self.options = options or StackOptions()
        self.nats = NatsServer(self.root / "nats")
        self.redis = RedisServer(self.root / "redis")
        self.engines: list[ServiceProcess] = []
        self.endpoints: list[EngineEndpoints] = []
        self.listener: ServiceProcess | None = None
        self.indexers: list[ServiceProcess] = []
        self.router: ServiceProcess | None = None
        self._ports: set[int] = set()
        self.router_port = self._port()

    # -- files -------------------------------------------------------------------------------
    def _port(self, span: int = 1) -> int:
        """A free port (and the `span - 1` after it) that no other service of the stack holds."""
        while True:
            port = free_port()
            wanted = set(range(port, port + span))
            if wanted & self._ports or any(not port_is_free(p) for p in range(port + 1, port + span)):
                continue
            self._ports |= wanted
            return port

    def _engine(self, i: int) -> ServiceProcess:
        o = self.options
        http_port, zmq_port = self._port(), self._port(2)  # the replay socket takes zmq_port + 1
        info = self.root / f"engine-{i}.json"
        argv = _python(
            "continuum_sim",
            "--count", "1", "--name-prefix", f"engine{i}", "--base-port", str(http_port),
            "--zmq-base-port", str(zmq_port), "--buffer-steps", str(o.buffer_steps), "--info-file", str(info),
            "--model", MODEL, "--num-gpu-blocks", str(o.num_gpu_blocks), "--time-scale", str(o.time_scale),
            "--log-level", "WARNING",
        )  # fmt: skip
        return ServiceProcess(f"engine{i}", argv, f"http://127.0.0.1:{http_port}/health", self.root, http_port)

    def router_config(self) -> dict[str, Any]:
        o = self.options
        e0 = self.endpoints[0]
        group = {
            "name": "sims",
            "models": [MODEL],
            "mode": "precise",
            "engine": "vllm",
            "block_size": e0.block_size,
            "hash_seed": e0.python_hash_seed,
        }
        backends = [
            {
                "name": e.name,
                "url": e.url,
                "type": "vllm",
                "models": [MODEL],
                "health_check_interval_ms": o.health_check_interval_ms,
                "first_byte_timeout_ms": o.first_byte_timeout_ms,
                "stream_idle_timeout_ms": o.stream_idle_timeout_ms,
            }
            for e in self.endpoints
        ]
        token = self.root / "admin-token"
        token.write_text(ADMIN_TOKEN)
        data: dict[str, Any] = {
            "server": {"host": "127.0.0.1", "port": self.router_port},
            "selection_strategy": "PrefixAwareHash",
            "prefix_routing": {"enabled": True},
            "backends": backends,
            "bus": {"embedded": False, "url": self.nats.url},
            "redis": {"url": self.redis.url, "connect_timeout_ms": 500, "command_timeout_ms": 500},
            "kv_cache_index": {"enabled": True, "backend": "redis", "groups": [group]},
            "admin": {"token_file": str(token)},
        }
        if o.response_cache:
            data["response_cache"] = {"enabled": True, "backend": "redis"}
        return data

    def listener_config(self, port: int) -> dict[str, Any]:
        return {
            "listen": f"127.0.0.1:{port}",
            "bus": {"embedded": False, "url": self.nats.url},
            "sources": [{**s, "publish": "blocks"} for s in listener_sources(self.endpoints)],
        }

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # Two phases, each started in parallel (a Python process takes seconds to import on a busy
        # 2-core machine): what the services connect to, then the services. The engines need
        # nothing; the indexers and the listener retry NATS and the stream until they exist.
        self.engines = [self._engine(i) for i in range(self.options.engines)]
        await asyncio.gather(self.nats.start(), self.redis.start(), *(e.start() for e in self.engines))
        self.endpoints = [_read_endpoint(self.root / f"engine-{i}.json") for i in range(len(self.engines))]
        router_file = self.root / "router.yaml"
        router_file.write_text(yaml.safe_dump(self.router_config(), sort_keys=False))
        env_level = ("--log-level", self.options.log_level)
        lport = self._port()
        listener_file = self.root / "listener.yaml"
        listener_file.write_text(yaml.safe_dump(self.listener_config(lport), sort_keys=False))
        self.listener = ServiceProcess(
            "listener",
            _python("continuum_listener", "--config", str(listener_file), *env_level),
            f"http://127.0.0.1:{lport}/healthz",
            self.root,
            lport,
        )
        for i in range(self.options.indexers):
            port = self._port()
            argv = _python(
                "continuum_indexer", "--config", str(router_file), "--listen", f"127.0.0.1:{port}", *env_level
            )
            self.indexers.append(
                ServiceProcess(f"indexer{i}", argv, f"http://127.0.0.1:{port}/healthz", self.root, port)
            )
        self.router = ServiceProcess(
            "router",
            _python("continuum_router", "serve", "--config", str(router_file), "--watch-interval", "0", *env_level),
            f"http://127.0.0.1:{self.router_port}/healthz",
            self.root,
            self.router_port,
        )
        await asyncio.gather(self.listener.start(), *(i.start() for i in self.indexers), self.router.start())

    async def restore(self) -> None:
        """Start again whatever a drill left stopped (a drill that failed half-way), bus and
        stores first, so several drills can share one stack."""
        processes = self.processes()
        await asyncio.gather(*(p.start() for n, p in processes.items() if n in ("nats", "redis")))
        await asyncio.gather(*(p.start() for n, p in processes.items() if n not in ("nats", "redis")))

    async def close(self) -> None:
        services: list[ManagedProcess] = [*self.engines, *self.indexers]
        for single in (self.router, self.listener):
            if single is not None:
                services.append(single)
        await asyncio.gather(*(s.stop(grace=5) for s in services), return_exceptions=True)
        await asyncio.gather(self.nats.stop(), self.redis.stop(), return_exceptions=True)

    async def __aenter__(self) -> ProcessStack:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- views -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def processes(self) -> dict[str, ManagedProcess]:
        out: dict[str, ManagedProcess] = {"nats": self.nats, "redis": self.redis}
        out.update({e.name: e for e in self.engines})
        if self.listener is not None:
            out["listener"] = self.listener
        out.update({i.name: i for i in self.indexers})
        if self.router is not None:
            out["router"] = self.router
        return out

    def rss(self) -> dict[str, int | None]:
        return {name: rss_bytes(_pid(p)) for name, p in self.processes().items()}

    def tail(self, name: str, lines: int = 30) -> str:
        return self.processes()[name].log_tail(lines)

    async def metrics(self, url: str) -> dict[str, float]:
        """Every sample of a /metrics page, keyed `name{labels}`."""
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(url)).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[key] = float(value)
        return out

    async def router_metrics(self) -> dict[str, float]:
        return await self.metrics(self.url + "/metrics")

    async def backend_healthy(self, backend: str, within: float = 15.0) -> bool:
        """Wait until the router takes traffic to `backend` again (`continuum_backend_healthy`)."""
        key = f'continuum_backend_healthy{{backend="{backend}"}}'
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if (await self.router_metrics()).get(key) == 1.0:
                return True
            await asyncio.sleep(0.1)
        return False

    async def admin(self, path: str) -> Any:
        async with httpx.AsyncClient(timeout=5, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            response = await client.get(self.url + "/admin" + path)
        response.raise_for_status()
        return response.json()

    async def index_blocks(self) -> dict[str, int]:
        """Blocks the KV index holds per backend (GPU tier), as the router's admin API reports."""
        body = await self.admin("/kv-index/stats")
        blocks = body.get("blocks") or {}
        rows = blocks.get("backends") if isinstance(blocks, dict) else None
        out: dict[str, int] = {}
        for name, row in (rows or {}).items():
            out[name] = int(row.get("gpu_blocks", 0))
        return out

    async def engine_hashes(self) -> dict[str, int]:
        """Distinct block hashes each running engine holds in its prefix cache (its own gauge):
        the ground truth the index should converge to once the engines are quiet."""
        out: dict[str, int] = {}
        for endpoint, engine in zip(self.endpoints, self.engines, strict=True):
            if engine.running:
                sample = await self.metrics(endpoint.url + "/metrics")
                out[endpoint.name] = int(sample.get("continuum_sim_cached_block_hashes", -1))
        return out

    async def converged(self, within: float = 15.0) -> tuple[dict[str, int], dict[str, int]]:
        """Wait until the index holds exactly what each running engine holds; returns the last
        (index, engines) views either way, for the caller to assert and report."""
        deadline = time.monotonic() + within
        while True:
            index, engines = await self.index_blocks(), await self.engine_hashes()
            if all(index.get(name, 0) == count for name, count in engines.items()) or time.monotonic() > deadline:
                return index, engines
            await asyncio.sleep(0.25)


def _pid(process: ManagedProcess) -> int | None:
    proc = process._proc
    return None if proc is None or proc.returncode is not None else proc.pid


def _read_endpoint(path: Path) -> EngineEndpoints:
    for _ in range(100):
        if path.exists():
            break
        time.sleep(0.05)
    data = json.loads(path.read_text())
    rows = data if isinstance(data, list) else data.get("engines", [])
    return EngineEndpoints(**rows[0])


# -- load -------------------------------------------------------------------------------------
SYSTEM_PROMPTS = 4


def request_body(i: int, *, stream: bool, max_tokens: int = 16) -> dict[str, Any]:
    """Production-shaped: a few long shared system prompts, a distinct user turn per request,
    temperature 0 (so the response cache takes part)."""
    system = " ".join(f"policy{i % SYSTEM_PROMPTS} clause{j}" for j in range(120))
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"question {i} " * 8}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


@dataclass
class LoadReport:
    sent: int = 0
    ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    slowest: float = 0.0

    @property
    def lost(self) -> int:
        return sum(self.failures.values())

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def line(self, name: str) -> str:
        failures = ", ".join(f"{k} {v}" for k, v in sorted(self.failures.items())) or "none"
        return (
            f"{name}: sent {self.sent}, ok {self.ok}, lost {self.lost} ({failures}); "
            f"p50 {self.percentile(0.5) * 1000:.0f} ms, p99 {self.percentile(0.99) * 1000:.0f} ms, "
            f"slowest {self.slowest:.2f} s"
        )


class Load:
    """Requests at `rate` per second (alternating streamed and not) until stopped. A request is
    lost when it gets no 200 or a stream does not end with `[DONE]`."""

    def __init__(self, url: str, rate: float = 20.0, *, timeout: float = 60.0, stream_share: float = 0.5) -> None:
        self.url = url
        self.rate = rate
        self.timeout = timeout
        self.stream_every = round(1 / stream_share) if stream_share > 0 else 0
        self.report = LoadReport()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._next = 0

    async def __aenter__(self) -> Load:
        self._client = httpx.AsyncClient(
            base_url=self.url, timeout=self.timeout, limits=httpx.Limits(max_connections=512)
        )
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> LoadReport:
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        await self._client.aclose()
        return self.report

    async def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            task = asyncio.create_task(self._one(self._next))
            self._next += 1
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            next_at += interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.monotonic()))

    async def _one(self, i: int) -> None:
        stream = bool(self.stream_every) and i % self.stream_every == 0
        body = request_body(i, stream=stream)
        self.report.sent += 1
        started = time.monotonic()
        try:
            outcome = await (self._streamed(body) if stream else self._whole(body))
        except httpx.TimeoutException:
            outcome = "timeout"
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        elapsed = time.monotonic() - started
        self.report.slowest = max(self.report.slowest, elapsed)
        if outcome == "ok":
            self.report.ok += 1
            self.report.latencies.append(elapsed)
        else:
            self.report.failures[outcome] += 1

    async def _whole(self, body: dict[str, Any]) -> str:
        response = await self._client.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            return f"http_{response.status_code}"
        return "ok" if response.json().get("choices") else "empty"

    async def _streamed(self, body: dict[str, Any]) -> str:
        async with self._client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return f"http_{response.status_code}"
            tail = b""
            async for chunk in response.aiter_bytes():
                tail = (tail + chunk)[-256:]
            if b'"error"' in tail:
                return "stream_error_event"
            return "ok" if tail.rstrip().endswith(b"data: [DONE]") else "stream_cut"
