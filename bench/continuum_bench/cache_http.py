"""End-to-end HTTP latency of the response cache (`python -m continuum_bench.cache_http`).

What a client sees through one ingress process (`python -m continuum_router serve`), non-stream
chat completions over keep-alive HTTP/1.1, for each response-cache backend:

* `hit`   the same temperature-0 request every time: answered from the cache, no backend;
* `miss`  a new temperature-0 request every time (a counter in the user message): lookup,
          forward to the backend, store the answer;
* `off`   (memory row only) the cache disabled: the plain forwarding path, for reference.

Processes: a canned-answer backend (continuum_bench.ingress_latency's raw asyncio server, ~20 µs per
request), a `redis-server` on loopback for the Redis rows, one ingress per cache backend, and
the load generator (this module's `load` subcommand, raw asyncio streams, one keep-alive
connection per concurrent client) in a process of its own. p50/p99 per cell are the medians
over `--repeats` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
import yaml

from continuum_bench.ingress_latency import MODEL, SYSTEM, _wait_port
from continuum_common.procs import find_binary, free_port

MODES = ("hit", "miss")


def _body(mode: str, n: int) -> bytes:
    question = "Say hello." if mode == "hit" else f"Say hello, number {n}."
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": 16,
            "temperature": 0,
        }
    ).encode()


# -- the load generator (separate process) -------------------------------------------------
async def _client(
    port: int, mode: str, counter: itertools.count[int], deadline: float, latencies: list[float]
) -> dict[str, int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    seen: dict[str, int] = {}
    clock = time.perf_counter
    while clock() < deadline:
        body = _body(mode, next(counter))
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer sk-bench\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body
        start = clock()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        lower = head.lower()
        at = lower.find(b"content-length:")
        await reader.readexactly(int(lower[at + 15 :].split(b"\r\n", 1)[0]))
        latencies.append(clock() - start)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        at = lower.find(b"x-cache:")
        status = lower[at + 8 :].split(b"\r\n", 1)[0].strip().decode() if at >= 0 else "none"
        seen[status] = seen.get(status, 0) + 1
    writer.close()
    return seen


async def _load(port: int, mode: str, concurrency: int, seconds: float, warmup: float, seed: int) -> dict[str, Any]:
    # Miss bodies are numbered from `seed` so no run repeats an earlier run's requests.
    counter = itertools.count(seed)
    if warmup:
        await asyncio.gather(
            *(_client(port, mode, counter, time.perf_counter() + warmup, []) for _ in range(concurrency))
        )
    latencies: list[float] = []
    start = time.perf_counter()
    seen = await asyncio.gather(*(_client(port, mode, counter, start + seconds, latencies) for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    statuses: dict[str, int] = {}
    for part in seen:
        for key, value in part.items():
            statuses[key] = statuses.get(key, 0) + value
    return {
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "x_cache": statuses,
    }


def _run_load(port: int, mode: str, concurrency: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "continuum_bench.cache_http", "load", str(port), mode, str(concurrency),
         str(args.seconds), str(args.warmup), str(seed)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# -- orchestration ---------------------------------------------------------------------------
def _config(workdir: Path, name: str, backend_port: int, response_cache: dict[str, Any]) -> Path:
    data = {
        "selection_strategy": "PrefixAwareHash",
        "prefix_routing": {"enabled": True},
        "response_cache": {"capacity": 100_000, **response_cache},
        "backends": [
            {
                "name": "fast",
                "url": f"http://127.0.0.1:{backend_port}",
                "type": "vllm",
                "models": [MODEL],
                "health_check_interval_ms": 5000,
            }
        ],
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _start(cmd: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    _wait_port(port, proc)
    return proc


def main_bench(args: argparse.Namespace) -> None:
    env = {**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"}
    backend_port, redis_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[tuple[str, str, int, dict[str, Any]]] = []
    seeds = itertools.count(0, 10_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            procs.append(
                _start(
                    [sys.executable, "-m", "continuum_bench.ingress_latency", "backend", str(backend_port)],
                    backend_port,
                    env,
                )
            )
            procs.append(
                _start(
                    [find_binary("redis-server"), "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", tmp],
                    redis_port, env,
                )
            )  # fmt: skip
            redis = {"url": f"redis://127.0.0.1:{redis_port}"}
            setups = [
                ("memory", {"enabled": True, "backend": "memory"}, (*MODES, "off")),
                ("redis", {"enabled": True, "backend": "redis", "redis": redis}, MODES),
            ]
            for name, cache_cfg, modes in setups:
                ingress_port = free_port()
                config = _config(work, name, backend_port, cache_cfg)
                serve = [sys.executable, "-m", "continuum_router", "serve", "--config", str(config),
                         "--port", str(ingress_port), "--watch-interval", "0"]  # fmt: skip
                ingress = _start(serve, ingress_port, env)
                try:
                    for mode in modes:
                        if mode == "off":
                            ingress.terminate()
                            ingress.wait(10)
                            config = _config(work, "off", backend_port, {"enabled": False})
                            serve[serve.index("--config") + 1] = str(config)
                            ingress = _start(serve, ingress_port, env)
                        load_mode = "miss" if mode == "off" else mode
                        for concurrency in args.concurrency:
                            runs = [
                                _run_load(ingress_port, load_mode, concurrency, args, next(seeds))
                                for _ in range(args.repeats)
                            ]
                            rows.append((name, mode, concurrency, _median(runs)))
                finally:
                    ingress.terminate()
                    ingress.wait(10)
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(10)
    _print(rows)


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50_ms", "p99_ms")}
    statuses: dict[str, int] = {}
    for run in runs:
        for key, value in run["x_cache"].items():
            statuses[key] = statuses.get(key, 0) + value
    out["x_cache"] = statuses
    return out


def _print(rows: list[tuple[str, str, int, dict[str, Any]]]) -> None:
    print(f"{'store':<7} {'mode':<5} {'conc':>4} | {'p50':>8} {'p99':>8} | {'req/s':>7} | X-Cache seen")
    for name, mode, concurrency, r in rows:
        seen = ", ".join(f"{k}={v}" for k, v in sorted(r["x_cache"].items()))
        print(
            f"{name:<7} {mode:<5} {concurrency:>4} | {r['p50_ms']:>6.3f}ms {r['p99_ms']:>6.2f}ms | "
            f"{r['rps']:>7.0f} | {seen}"
        )
    print("hit: the same temperature-0 request (no backend call); miss: a new one each time (lookup + forward +")
    print("store); off: response cache disabled (the plain forwarding path). Backend: canned answer, ~20 µs.")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        port, mode, concurrency = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
        seconds, warmup, seed = float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
        print(json.dumps(uvloop.run(_load(port, mode, concurrency, seconds, warmup, seed))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell; the median is reported")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    main_bench(parser.parse_args())


if __name__ == "__main__":
    main()
