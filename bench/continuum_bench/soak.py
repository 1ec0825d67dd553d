"""Soak benchmark (`python -m continuum_bench.soak`): many streams held open through a whole stack of
real processes for a long time, then what went wrong and how the services' memory moved.

The stack is continuum_bench.procstack's: NATS, Redis, simulated vLLM engines (vLLM-like timings), the KV
listener, two indexers and the router with the Redis response cache and KV index. `--streams`
clients each stream chat completions back to back (a few long shared system prompts, a distinct
question each, `max_tokens` tokens), so about that many streams are always open. Reported:
streams completed and failed (a failure is a non-200, a transport error, an in-band error event
or a stream that does not end with `[DONE]`), time to first token and stream duration
percentiles, and the resident memory of every service at the start and the end.

    python -m continuum_bench.soak                          # 256 streams for 10 minutes
    python -m continuum_bench.soak --seconds 60 --check     # the CI variant: exit 1 on any failure

The client is raw asyncio on uvloop (HTTP/1.1, one request per connection), so it spends
little of the machine the stack needs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from continuum_bench.procstack import ProcessStack, StackOptions, request_body

MiB = 1024 * 1024


@dataclass
class SoakResult:
    completed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    ttft: list[float] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_stream(port: int, body: bytes, limit: float) -> tuple[str, float, float]:
    """(outcome, seconds to the first token event, seconds to the end)."""
    started = time.monotonic()
    first = 0.0
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), limit)
    try:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        writer.write(head + body)
        status_line = await asyncio.wait_for(reader.readline(), limit)
        if b" 200 " not in status_line:
            return f"http_{status_line.split(b' ')[1].decode(errors='replace') if b' ' in status_line else '?'}", 0, 0
        tail = b""
        async with asyncio.timeout(limit):
            while chunk := await reader.read(65536):
                if not first and b'"content"' in chunk:
                    first = time.monotonic() - started
                tail = (tail + chunk)[-512:]
    except TimeoutError:
        return "timeout", first, time.monotonic() - started
    except OSError as exc:
        return type(exc).__name__, first, time.monotonic() - started
    finally:
        writer.close()
    if b'"error"' in tail:
        return "stream_error_event", first, time.monotonic() - started
    if b"data: [DONE]" not in tail:
        return "stream_cut", first, time.monotonic() - started
    return "ok", first, time.monotonic() - started


async def client(port: int, worker: int, deadline: float, result: SoakResult, max_tokens: int) -> None:
    i = worker
    while time.monotonic() < deadline:
        body = json.dumps(request_body(i, stream=True, max_tokens=max_tokens)).encode()
        i += 100_003
        outcome, ttft, duration = await one_stream(port, body, limit=120.0)
        if outcome == "ok":
            result.completed += 1
            result.ttft.append(ttft)
            result.durations.append(duration)
        else:
            result.failures[outcome] += 1


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="continuum-soak-"))
    options = StackOptions(engines=args.engines, time_scale=args.time_scale, num_gpu_blocks=args.num_gpu_blocks)
    async with ProcessStack(root, options) as stack:
        start_rss = stack.rss()
        result = SoakResult()
        began = time.monotonic()
        deadline = began + args.seconds
        workers = [
            asyncio.create_task(client(stack.router_port, w, deadline, result, args.max_tokens))
            for w in range(args.streams)
        ]
        # Half-way memory: growth in the second half is what a leak looks like (the first half
        # includes warm-up: pools, caches and buffers filling to their bounds).
        await asyncio.sleep(args.seconds / 2)
        mid_rss = stack.rss()
        await asyncio.gather(*workers)
        elapsed = time.monotonic() - began
        end_rss = stack.rss()
        alive = {name: p.running for name, p in stack.processes().items()}
    return {
        "streams": args.streams,
        "seconds": round(elapsed, 1),
        "completed": result.completed,
        "failed": result.failed,
        "failures": dict(result.failures),
        "error_rate": round(result.failed / max(1, result.completed + result.failed), 6),
        "streams_per_s": round(result.completed / elapsed, 1),
        "ttft_p50_ms": round(percentile(result.ttft, 0.5) * 1000, 1),
        "ttft_p99_ms": round(percentile(result.ttft, 0.99) * 1000, 1),
        "duration_p50_s": round(percentile(result.durations, 0.5), 3),
        "duration_p99_s": round(percentile(result.durations, 0.99), 3),
        "rss_mib": {
            name: [_mib(start_rss.get(name)), _mib(mid_rss.get(name)), _mib(end_rss.get(name))]
            for name in sorted(set(start_rss) | set(end_rss))
        },
        "all_alive": all(alive.values()),
    }


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / MiB, 1)


def render(report: dict[str, Any]) -> str:
    lines = [
        f"soak: {report['streams']} streams for {report['seconds']} s: {report['completed']} completed "
        f"({report['streams_per_s']}/s), {report['failed']} failed {report['failures'] or ''}",
        f"  error rate {report['error_rate']:.4%}; TTFT p50 {report['ttft_p50_ms']} ms, p99 {report['ttft_p99_ms']} ms; "
        f"stream p50 {report['duration_p50_s']} s, p99 {report['duration_p99_s']} s",
        "  RSS (MiB, start -> half-way -> end): "
        + ", ".join(f"{name} {a} -> {m} -> {b}" for name, (a, m, b) in report["rss_mib"].items()),
        f"  every service still running: {report['all_alive']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m continuum_bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256, help="streams held open at once (default 256)")
    parser.add_argument("--seconds", type=float, default=600.0, help="how long (default 600)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per stream (default 128)")
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=1.0, help="engine speed: real s per simulated s")
    parser.add_argument("--num-gpu-blocks", type=int, default=8192)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--check", action="store_true", help="exit 1 on any failed stream or a dead service")
    args = parser.parse_args(argv)
    report = uvloop.run(soak(args))
    print(render(report), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.check and (report["failed"] or not report["all_alive"] or not report["completed"]):
        print("soak: FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
