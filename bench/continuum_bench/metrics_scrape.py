"""What a Prometheus scrape of the ingress costs the requests it serves
(`python -m continuum_bench.metrics_scrape`).

    python -m continuum_bench.metrics_scrape                      # 32 backends, 3 repeats
    python -m continuum_bench.metrics_scrape --baseline ../old    # another checkout in the same rounds
    python -m continuum_bench.metrics_scrape --workers 2          # a `serve` of 2 workers

Three kinds of process: the canned backend of `continuum_bench.ingress_latency` (one server that
every backend entry points at), the ingress (`serve`, PrefixAwareHash over `--backends` entries,
so it has as many per-backend label sets as a fleet of that size), and this driver. A warm-up
sends requests with `--prompts` different system prompts, which spreads them over the backends
and fills every backend's label sets. Then, per repeat and per ingress:

* `alone`: a prober sends a non-streamed chat completion every `--probe-ms` on one keep-alive
  connection for `--seconds`, each timed from when it was due (a stall delays every request due
  during it, as with independent clients) (with `--workers` N, N probers, so that some share the worker a
  scrape reaches, which then also asks its siblings for their texts and merges them);
* `scraped`: the same while a scraper GETs `/metrics` every `--scrape-ms` on its own connection.

Reported: the prober's latency p50 / p99 / max in each phase (a request that arrives while the
ingress formats its exposition waits for the loop), the scrape's wall time p50 / max and the
exposition's size. Medians over the repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop
import yaml

from continuum_bench.ingress_latency import MODEL, _source_path, _start_ingress, _wait_port
from continuum_common.procs import free_port


def _config(backend_port: int, workdir: Path, backends: int, workers: int) -> Path:
    url = f"http://127.0.0.1:{backend_port}"
    data = {
        "server": {"workers": workers},
        "selection_strategy": "PrefixAwareHash",
        "prefix_routing": {"enabled": True},
        "backends": [
            {"name": f"b{i}", "url": url, "type": "vllm", "models": [MODEL], "health_check_interval_ms": 5000}
            for i in range(backends)
        ],
    }
    path = workdir / f"scrape-config-{backends}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _request(prompt: int) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "max_tokens": 16,
            "messages": [
                {"role": "system", "content": f"Assistant {prompt} of the scrape benchmark. " * 8},
                {"role": "user", "content": "Say hello."},
            ],
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer bench\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bytes:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at < 0 or not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    length = int(lower[at + 15 :].split(b"\r\n", 1)[0])
    return await reader.readexactly(length)


async def _warm(port: int, prompts: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for i in range(prompts):
        await _exchange(reader, writer, _request(i))
    writer.close()


async def _probe(port: int, until: float, every: float, latencies: list[float]) -> None:
    """Requests on a fixed schedule, one every `every` seconds, each timed from when it was due:
    a stall delays every request due during it, as it would with clients that do not wait for
    each other (no coordinated omission)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = _request(0)
    clock = time.perf_counter
    due = clock()
    while due < until:
        wait = due - clock()
        if wait > 0:
            await asyncio.sleep(wait)
        await _exchange(reader, writer, request)
        latencies.append(clock() - due)
        due += every
    writer.close()


async def _scrape(port: int, until: float, every: float, durations: list[float], sizes: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    clock = time.perf_counter
    while clock() < until:
        start = clock()
        body = await _exchange(reader, writer, request)
        durations.append(clock() - start)
        sizes.append(len(body))
        await asyncio.sleep(max(0.0, every - (clock() - start)))
    writer.close()


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


async def _phase(port: int, args: argparse.Namespace, scrape_s: float | None) -> dict[str, float]:
    latencies: list[float] = []
    durations: list[float] = []
    sizes: list[int] = []
    until = time.perf_counter() + args.seconds
    tasks = [_probe(port, until, args.probe_ms / 1000, latencies) for _ in range(args.workers)]
    if scrape_s is not None:
        tasks.append(_scrape(port, until, scrape_s, durations, sizes))
    await asyncio.gather(*tasks)
    row = {
        "requests": float(len(latencies)),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": _ms(latencies, 0.99),
        "p999_ms": _ms(latencies, 0.999),
        "max_ms": max(latencies) * 1000,
        "over_2ms": float(sum(1 for v in latencies if v > 0.002)),
    }
    if durations:
        row |= {
            "scrapes": float(len(durations)),
            "scrape_p50_ms": statistics.median(durations) * 1000,
            "scrape_max_ms": max(durations) * 1000,
            "bytes": float(statistics.median(sizes)),
        }
    return row


async def _measure(ports: dict[str, int], args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, float]]]]:
    for port in ports.values():
        await _warm(port, args.prompts)
    results: dict[str, dict[str, list[dict[str, float]]]] = {n: {"alone": [], "scraped": []} for n in ports}
    for _ in range(args.repeats):
        for name, port in ports.items():  # interleaved: machine load hits every ingress alike
            results[name]["alone"].append(await _phase(port, args, None))
            scraped = await _phase(port, args, args.scrape_ms / 1000)
            results[name]["scraped"].append(scraped)
    return results


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", type=int, default=32, help="backend entries in the ingress's configuration")
    parser.add_argument("--prompts", type=int, default=400, help="warm-up requests, each with its own system prompt")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--scrape-ms", type=float, default=1000.0, help="interval between scrapes in the scraped phase")
    parser.add_argument("--probe-ms", type=float, default=2.0, help="interval between a prober's requests")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="server.workers of the ingress (and the probers)")
    parser.add_argument("--baseline", type=Path, help="another Continuum checkout measured in the same rounds")
    args = parser.parse_args()
    env = {**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"}
    backend_port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        backend = subprocess.Popen(
            [sys.executable, "-m", "continuum_bench.ingress_latency", "backend", str(backend_port)], env=env
        )
        procs.append(backend)
        try:
            _wait_port(backend_port, backend)
            config = _config(backend_port, Path(tmp), args.backends, args.workers)
            ports = {"continuum": free_port()}
            procs.append(_start_ingress(config, ports["continuum"], env))
            if args.baseline is not None:
                ports["baseline"] = free_port()
                baseline_env = {**env, "PYTHONPATH": _source_path(args.baseline.resolve())}
                procs.append(_start_ingress(config, ports["baseline"], baseline_env))
            results = uvloop.run(_measure(ports, args))
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(30)
    print(
        f"{args.backends} backends, {args.workers} worker(s); probes alone / while /metrics is scraped every "
        f"{args.scrape_ms:g} ms; "
        f"medians of {args.repeats} runs of {args.seconds:g} s"
    )
    print(
        "| ingress | prober p50 / p99 / p99.9 / max alone (ms) | scraped (ms) | probes over 2 ms alone / scraped "
        "| scrape p50 / max (ms) | exposition |"
    )
    print("|---|---|---|---|---|---:|")
    for name, phases in results.items():
        alone, scraped = _median(phases["alone"]), _median(phases["scraped"])
        print(
            f"| {name} | {alone['p50_ms']:.2f} / {alone['p99_ms']:.2f} / {alone['p999_ms']:.2f} / {alone['max_ms']:.1f} "
            f"| {scraped['p50_ms']:.2f} / {scraped['p99_ms']:.2f} / {scraped['p999_ms']:.2f} / {scraped['max_ms']:.1f} "
            f"| {alone['over_2ms']:.0f} / {scraped['over_2ms']:.0f} "
            f"| {scraped['scrape_p50_ms']:.1f} / {scraped['scrape_max_ms']:.1f} | {scraped['bytes'] / 1024:.0f} KiB |"
        )


if __name__ == "__main__":
    main()
