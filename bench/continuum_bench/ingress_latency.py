"""Ingress overhead benchmark (`python -m continuum_bench.ingress_latency`).

Measures what the ingress adds over calling a fast local backend directly, non-streamed chat
completions over keep-alive HTTP/1.1:

* added latency at concurrency 1 and 64 (p50 / p99 of ingress minus direct), and
* requests/s through the ingress at concurrency 64, and
* the router's CPU time per request (user + system, its process and its children: every worker
  of `server.workers`, every thread of a peer), which machine noise moves far less than
  requests/s when several processes share two cores.

Three processes, so the ingress is measured as it runs in production: a minimal canned-answer
backend (raw asyncio protocol on uvloop, ~20 µs per request), the ingress
(`python -m continuum_ingress serve`, PrefixAwareHash over 3 backend entries on that server, so
the Tier 1 path runs), and a load generator (raw asyncio streams on uvloop, one connection per
concurrent client). Targets: <= 1 ms added p50 at concurrency 1, >= 1,500 req/s.

`--workers 1 2` measures one `serve` per value of `server.workers`, all started at once on their
own ports; each repeat runs direct, then every ingress in turn (interleaved rounds, so a change
in machine load hits every variant alike).

`--stream` sends streamed chat completions instead: the backend answers with its head and first
event at once and 16 more events 2 ms later (as an engine sends its first token, then the rest),
and the latency measured is the time to the first event, the part of a time to first token a
router adds.

`--tokens 120 --token-gap-ms 6.5` makes each streamed answer the fleet's shape instead: after
the first event, 120 more, one write each 6.5 ms (the router relays every one), and
`--prompt-bytes 8000` sends a system prompt of about 8 KB (the fleet's multi-turn prompts are
4-12 KB) instead of the ~240-byte default request.

`--transport h1 aiohttp` measures the ingress with each upstream HTTP transport: the hand-written
HTTP/1.1 pool (the product's) and aiohttp (`pip install -e '.[bench]'`). Every variant then runs
in the same one-process launcher (the composition `serve` runs with one worker: the ingress app
on the same server, uvloop), so the transport is the only difference; one worker only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import uvloop
import yaml

from continuum_common.procs import free_port

MODEL = "bench-model"
SYSTEM = "You are a concise assistant for the Continuum benchmark. " * 4
BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "temperature": 0.7,
    }
).encode()
STREAM_BODY = json.dumps({**json.loads(BODY), "stream": True}).encode()


def _bodies(prompt_bytes: int) -> tuple[bytes, bytes]:
    """(whole, streamed) request bodies; with `prompt_bytes`, a system prompt of about that
    many bytes (the benchmark fleet's prompts are 4-12 KB) instead of the ~240-byte default."""
    if prompt_bytes <= 0:
        return BODY, STREAM_BODY
    words = [f"item{i % 997} holds {i * 7 % 101} parts" for i in range(prompt_bytes // 20 + 1)]
    system = " ".join(words)[:prompt_bytes]
    doc = {
        **json.loads(BODY),
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Say hello."}],
    }
    return json.dumps(doc).encode(), json.dumps({**doc, "stream": True}).encode()


def _sse_chunk(data: str) -> bytes:
    event = f"data: {data}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(event), event)


def _delta(content: str, finish: str | None = None) -> str:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    return json.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": MODEL, "choices": [choice]})


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
# A stream as an engine sends it: the head with the first token, the rest a moment later.
STREAM_FIRST = STREAM_HEAD + _sse_chunk(_delta("Hello"))
STREAM_REST = b"".join(_sse_chunk(_delta(f" word{i}")) for i in range(15)) + _sse_chunk(_delta("", "stop"))
STREAM_REST += _sse_chunk("[DONE]") + b"0\r\n\r\n"
STREAM_GAP_S = 0.002

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 60, "completion_tokens": 2, "total_tokens": 62},
    }
).encode()


# -- the fast backend ---------------------------------------------------------------------
class _Backend(asyncio.Protocol):
    def __init__(self, tokens: int = 0, token_gap_s: float = 0.0) -> None:
        # tokens > 0: after the first event, `tokens` more, one write each `token_gap_s` apart
        # (as an engine streams a long answer), instead of the rest at once 2 ms later
        self.tokens = tokens
        self.token_gap_s = token_gap_s
        self.buf = b""
        self.transport: asyncio.WriteTransport | None = None
        self.reply = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(ANSWER)).encode()
            + b"\r\n\r\n"
            + ANSWER
        )
        self.health = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        # The peer routers learn a worker's model from GET /v1/models.
        models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]})
        self.models = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(models)).encode()
            + b"\r\n\r\n"
            + models.encode()
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            total = end + 4 + length
            if len(self.buf) < total:
                return
            is_get = head.startswith(b"get")
            request_body = self.buf[end + 4 : total]
            # routers may re-encode the body: with or without the space
            streamed = b'"stream": true' in request_body or b'"stream":true' in request_body
            self.buf = self.buf[total:]
            assert self.transport is not None
            if is_get:
                self.transport.write(self.models if head.startswith(b"get /v1/models") else self.health)
            elif streamed:
                self.transport.write(STREAM_FIRST)
                if self.tokens > 0:
                    asyncio.get_running_loop().call_later(self.token_gap_s, self._token, self.transport, 1)
                else:
                    asyncio.get_running_loop().call_later(STREAM_GAP_S, self._rest)
            else:
                self.transport.write(self.reply)

    def _token(self, transport: asyncio.WriteTransport, sent: int) -> None:
        if transport.is_closing():
            return
        if sent >= self.tokens:
            transport.write(_sse_chunk(_delta("", "stop")) + _sse_chunk("[DONE]") + b"0\r\n\r\n")
            return
        transport.write(_sse_chunk(_delta(f" word{sent}")))
        asyncio.get_running_loop().call_later(self.token_gap_s, self._token, transport, sent + 1)

    def _rest(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(STREAM_REST)


async def _serve_backend(port: int, tokens: int = 0, token_gap_s: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Backend(tokens, token_gap_s), "127.0.0.1", port, backlog=2048)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


# -- the load generator -------------------------------------------------------------------
async def _client(
    port: int, path: str, deadline: float, latencies: list[float], stream: bool = False, prompt_bytes: int = 0
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    whole, streamed = _bodies(prompt_bytes)
    body = streamed if stream else whole
    request = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer bench\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    clock = time.perf_counter
    while clock() < deadline:
        start = clock()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if stream:
            latencies.append(await _first_event(reader, head) - start)
            continue
        lower = head.lower()
        at = lower.find(b"content-length:")
        length = int(lower[at + 15 :].split(b"\r\n", 1)[0])
        await reader.readexactly(length)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        latencies.append(clock() - start)
    writer.close()


async def _first_event(reader: asyncio.StreamReader, head: bytes) -> float:
    """Read a chunked SSE response to its end; the time its first `data:` event arrived."""
    if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
        raise RuntimeError(head.decode(errors="replace"))
    first = 0.0
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        data = await reader.readexactly(size + 2)
        if not first and b"data:" in data:
            first = time.perf_counter()
        if size == 0:
            return first


async def _load(
    port: int, concurrency: int, seconds: float, warmup: float, stream: bool = False, prompt_bytes: int = 0
) -> dict[str, float]:
    path = "/v1/chat/completions"
    warm: list[float] = []
    if warmup:
        deadline = time.perf_counter() + warmup
        await asyncio.gather(*(_client(port, path, deadline, warm, stream, prompt_bytes) for _ in range(concurrency)))
    latencies: list[float] = []
    start = time.perf_counter()
    await asyncio.gather(
        *(_client(port, path, start + seconds, latencies, stream, prompt_bytes) for _ in range(concurrency))
    )
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "requests": len(latencies),
        "all_requests": len(latencies) + len(warm),
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


# -- orchestration ------------------------------------------------------------------------
def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid` and its live descendants (/proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(used.get(p, 0.0) for p in tree)


def _run_load(
    port: int,
    concurrency: int,
    seconds: float,
    warmup: float,
    router: int | None = None,
    *,
    stream: bool = False,
    prompt_bytes: int = 0,
) -> dict[str, float]:
    """One load run; with `router` (a pid) also that router's CPU µs per request over the run
    (warm-up included in both the time and the count: the load process reports both)."""
    before = _tree_cpu(router) if router is not None else 0.0
    result = _load_process(port, concurrency, seconds, warmup, stream, prompt_bytes)
    if router is not None:
        result["cpu_us"] = (_tree_cpu(router) - before) * 1e6 / max(1.0, result["all_requests"])
    return result


def _load_process(
    port: int, concurrency: int, seconds: float, warmup: float, stream: bool, prompt_bytes: int
) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "continuum_bench.ingress_latency",
            "load",
            str(port),
            str(concurrency),
            str(seconds),
            str(warmup),
            "stream" if stream else "whole",
            str(prompt_bytes),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _config(
    backend_port: int, workdir: Path, *, workers: int = 1, strategy: str = "PrefixAwareHash", tracing: bool = False
) -> Path:
    url = f"http://127.0.0.1:{backend_port}"
    data: dict[str, object] = {
        "server": {"workers": workers},
        "selection_strategy": strategy,
        "prefix_routing": {"enabled": strategy == "PrefixAwareHash"},
        "backends": [
            {"name": f"b{i}", "url": url, "type": "vllm", "models": [MODEL], "health_check_interval_ms": 5000}
            for i in range(3)
        ],
    }
    if tracing:
        # Every request traced and exported; the canned backend takes the OTLP posts (any POST
        # gets a 200), so the cost measured is the router's, not a collector's.
        data["tracing"] = {"enabled": True, "otlp_endpoint": f"{url}/v1/traces", "sample_ratio": 1.0}
    path = workdir / f"bench-config-{workers}{'-traced' if tracing else ''}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _source_path(checkout: Path) -> str:
    """PYTHONPATH that runs the services of another Continuum checkout (`--baseline`)."""
    parts = [
        "libs/common",
        "services/router",
        "services/ingress",
        "services/indexer",
        "services/listener",
        "services/gemini-cache",
    ]
    return os.pathsep.join([*(str(checkout / p) for p in parts), str(checkout / "services/sim-engine"), str(checkout)])


def _start_ingress(
    config: Path, port: int, env: dict[str, str], transport: str | None = None
) -> subprocess.Popen[bytes]:
    """`serve` on `port` (or, with `transport`, the one-process launcher with that upstream
    transport), returned once it (every worker of it) listens: it prints one line then.
    `python -m continuum_ingress` runs `continuum-router` in this checkout and in a `--baseline`
    checkout that predates `python -m continuum_router`."""
    argv = [sys.executable, "-m", "continuum_ingress", "serve", "--config", str(config), "--port", str(port)]
    if transport is not None:
        argv = [sys.executable, "-m", "continuum_bench.ingress_latency", "ingress", str(config), str(port), transport]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"the ingress did not start (exit {proc.wait()})")
    return proc


PEER_POLICIES = {"RoundRobin": "round_robin", "PrefixAwareHash": "cache_aware"}


def _admitted(listing: Any) -> bool:
    """smg's GET /workers shows the worker "ready"; vllm-router's GET /list_workers lists it."""
    if not isinstance(listing, dict):
        return False
    workers = listing.get("workers")
    if isinstance(workers, list):
        return any(isinstance(w, dict) and w.get("status") == "ready" for w in workers)
    return bool(listing.get("urls"))


def _start_peer(name: str, backend_port: int, strategy: str, workdir: Path) -> tuple[int, subprocess.Popen[bytes]]:
    """smg or vllm-router in front of the canned backend (the policy closest to `strategy`),
    returned once it lists the backend as a ready worker."""
    from continuum_bench.peers.common import peer_binary

    port, metrics = free_port(), free_port()
    policy = PEER_POLICIES[strategy]
    common = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1"]
    common += ["--prometheus-port", str(metrics), "--policy", policy]
    backend = f"http://127.0.0.1:{backend_port}"
    if name == "smg":
        argv = [*peer_binary("smg"), "launch", *common, "--log-level", "warn", "--worker-urls", backend]
        listing = "/workers"
    else:
        argv = [*peer_binary("vllm-router"), *common, "--log-level", "warning", "--worker-urls", backend]
        listing = "/list_workers"
    log = (workdir / f"{name}.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {workdir / name}.log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{listing}", timeout=1) as answer:
                if _admitted(json.loads(answer.read())):
                    return port, proc
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{name} did not admit its worker")


def _variants(args: argparse.Namespace, backend_port: int, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """Every router measured, by name: Continuum per `--workers` value (and traced with
    `--tracing`), then each peer of `--peers`."""
    out: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    launcher = args.transport != ["h1"]
    for workers in args.workers:
        for traced in (False, True) if args.tracing else (False,):
            config = _config(backend_port, tmp, workers=workers, strategy=args.strategy, tracing=traced)
            for transport in args.transport:
                name = f"continuum w{workers}" + (f" {transport}" if launcher else "") + (" traced" if traced else "")
                port = free_port()
                out[name] = (port, _start_ingress(config, port, env, transport if launcher else None))
    if args.baseline is not None:
        port = free_port()
        workers = args.baseline_workers
        config = _config(backend_port, tmp, workers=workers, strategy=args.strategy)
        baseline_env = {**env, "PYTHONPATH": _source_path(args.baseline)}
        out[f"baseline w{workers}"] = (port, _start_ingress(config, port, baseline_env))
    for peer in args.peers:
        out[peer] = _start_peer(peer, backend_port, args.strategy, tmp)
    return out


def main_bench(args: argparse.Namespace) -> None:
    backend_port = free_port()
    env = {**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"}
    routers: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        backend = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "continuum_bench.ingress_latency",
                "backend",
                str(backend_port),
                str(args.tokens),
                str(args.token_gap_ms / 1000),
            ],
            env=env,
        )
        try:
            _wait_port(backend_port, backend)
            routers = _variants(args, backend_port, Path(tmp), env)
            rows: list[tuple[int, str, dict[str, float], dict[str, float]]] = []
            for concurrency in args.concurrency:
                direct: list[dict[str, float]] = []
                via: dict[str, list[dict[str, float]]] = {name: [] for name in routers}
                for _ in range(args.repeats):
                    direct.append(
                        _run_load(
                            backend_port,
                            concurrency,
                            args.seconds,
                            args.warmup,
                            stream=args.stream,
                            prompt_bytes=args.prompt_bytes,
                        )
                    )
                    for name, (port, proc) in routers.items():
                        load = _run_load(
                            port,
                            concurrency,
                            args.seconds,
                            args.warmup,
                            proc.pid,
                            stream=args.stream,
                            prompt_bytes=args.prompt_bytes,
                        )
                        via[name].append(load)
                for name, runs in via.items():
                    rows.append((concurrency, name, _median(direct), _median(runs)))
        finally:
            for _port, proc in routers.values():
                proc.terminate()
                proc.wait(60)
            backend.terminate()
            backend.wait(10)
    _report(args, rows)


def _report(args: argparse.Namespace, rows: list[tuple[int, str, dict[str, float], dict[str, float]]]) -> None:
    what = "streamed: latency = time to the first event" if args.stream else "whole answers"
    print(f"strategy {args.strategy}; {what}; median of {args.repeats} run(s) x {args.seconds:g} s per cell")
    print(
        f"{'conc':>4} {'router':>22} | {'direct p50':>10} {'p99':>8} | {'router p50':>10} {'p99':>8} | "
        f"{'added p50':>9} {'p99':>8} | {'router req/s':>12} {'direct req/s':>12} | {'CPU µs/req':>10}"
    )
    for concurrency, name, d, v in rows:
        print(
            f"{concurrency:>4} {name:>22} | {d['p50_ms']:>8.3f}ms {d['p99_ms']:>6.2f}ms | "
            f"{v['p50_ms']:>8.3f}ms {v['p99_ms']:>6.2f}ms | "
            f"{v['p50_ms'] - d['p50_ms']:>7.3f}ms {v['p99_ms'] - d['p99_ms']:>6.2f}ms | "
            f"{v['rps']:>12.0f} {d['rps']:>12.0f} | {v.get('cpu_us', float('nan')):>10.1f}"
        )
    print("targets: added p50 <= 1 ms at concurrency 1; >= 1500 req/s non-stream through the ingress;")
    print("with --peers: req/s at concurrency 64 >= the best peer's, p99 <= 1.5x the best peer's")


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


async def _serve_ingress(config: Path, port: int, transport: str) -> None:
    """The launcher of `--transport`: the ingress app with that upstream transport on the
    server `serve` uses, until SIGTERM."""
    import signal

    from continuum_ingress.app import IngressApp
    from continuum_ingress.server import RunningServer
    from continuum_ingress.transport import TransportFactory

    factory: TransportFactory | None = None
    if transport == "aiohttp":
        from continuum_ingress.adapters.aiohttp_transport import aiohttp_transport

        factory = aiohttp_transport
    app = IngressApp(config, transport=factory)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with RunningServer(app.asgi, "127.0.0.1", port, log_level="warning", edge=app.edge) as server:
        print(f"continuum-router listening on {server.url}", flush=True)
        await stop.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "backend":
        tokens, gap = (int(sys.argv[3]), float(sys.argv[4])) if len(sys.argv) > 4 else (0, 0.0)
        uvloop.run(_serve_backend(int(sys.argv[2]), tokens, gap))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "ingress":
        uvloop.run(_serve_ingress(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        port, concurrency, seconds, warmup = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
        stream = sys.argv[6:7] == ["stream"]
        prompt_bytes = int(sys.argv[7]) if len(sys.argv) > 7 else 0
        print(json.dumps(uvloop.run(_load(port, concurrency, seconds, warmup, stream, prompt_bytes))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell; the median is reported")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1], help="server.workers of the ingress; several values: one each"
    )
    parser.add_argument("--strategy", default="PrefixAwareHash", choices=["PrefixAwareHash", "RoundRobin"])
    parser.add_argument(
        "--stream",
        action="store_true",
        help="streamed chat completions: the backend sends its head with the first event and 16 more "
        "2 ms later; latency is the time to the first event",
    )
    parser.add_argument(
        "--peers",
        default="",
        type=lambda v: [p for p in v.split(",") if p],
        help="peer routers measured in the same rounds: smg,vllm-router (policy: round_robin for "
        "RoundRobin, cache_aware for PrefixAwareHash; `pip install -e '.[peers]'`)",
    )
    parser.add_argument(
        "--transport",
        nargs="+",
        default=["h1"],
        choices=["h1", "aiohttp"],
        help="upstream HTTP transport(s) of the ingress: h1 (the hand-written pool, default) and/or aiohttp; "
        "anything but `h1` alone runs every variant in the one-process launcher (one worker)",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=0,
        help="--stream: after the first event, this many more, one write each --token-gap-ms apart "
        "(as an engine streams; the fleet's answers are 64-120 tokens 6.5 ms apart); default: 16 in one write 2 ms later",
    )
    parser.add_argument("--token-gap-ms", type=float, default=6.5)
    parser.add_argument(
        "--prompt-bytes",
        type=int,
        default=0,
        help="a system prompt of about this many bytes (default: a ~240-byte request; the fleet's are 4-12 KB)",
    )
    parser.add_argument("--tracing", action="store_true", help="also measure each Continuum with every request traced")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another Continuum checkout (e.g. a git worktree of an earlier commit) measured beside",
    )
    parser.add_argument(
        "--baseline-workers", type=int, default=1, help="server.workers of the --baseline checkout (default 1)"
    )
    args = parser.parse_args()
    if args.transport != ["h1"] and args.workers != [1]:
        parser.error("--transport other than h1 alone runs one worker: use --workers 1")
    main_bench(args)


if __name__ == "__main__":
    main()
