"""How long an ingress takes to replay the route history when it starts, and what the replay
costs the traffic it serves meanwhile (`python -m continuum_bench.route_history`).

A private nats-server holds stream CONTINUUM_KV_ROUTES filled the way a fleet fills it:
`--conversations` conversations of `--turns` turns each, every turn one approximate routing
decision (its conversation's text-chunk chain so far, `--chunks-per-turn` more per turn) and
one remembered `/tokenize` answer (the conversation's block hashes so far, `--blocks-per-turn`
more per turn), over the last `--spread` seconds. Then a real ingress (`continuum-router
serve`) starts on it, and while it replays, `/healthz` is asked every `--probe-ms`: the
slowest answers show how long a replay batch holds the event loop. Reported, median of
`--repeats` starts: messages and megabytes replayed, the replay's own time (the ingress's log
line), messages per second, the `/healthz` p50 / p99 / max during the replay, and the
process's resident memory once it is done.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import nats
import yaml

from continuum_common.config.kv_index import RouteHistory
from continuum_common.procs import NatsServer, free_port
from continuum_common.wire.decisions import (
    HISTORY_STREAM,
    KIND_APPROXIMATE,
    KIND_CHAT,
    Decision,
    Tokenized,
    encode_decision,
    encode_tokenized,
    subject_for,
    tokenized_subject_for,
)
from continuum_ingress.kv.adapters.route_history import ensure_history_stream

MODEL = "bench-model"
REPLAYED = re.compile(r"replayed (\d+) shared routing messages in ([0-9.]+) s")


def config(nats_url: str) -> dict[str, Any]:
    """Two groups: approximate chat backends (the decisions) and precise ones without a local
    tokenizer (the tokenizations). No backend answers: only /healthz is asked."""
    url = f"http://127.0.0.1:{free_port()}"
    return {
        "selection_strategy": "PrefixAwareHash",
        "prefix_routing": {"enabled": True},
        "bus": {"embedded": False, "url": nats_url},
        "backends": [
            {"name": f"b{i}", "url": url, "type": "vllm", "models": [MODEL], "health_check_interval_ms": 60_000}
            for i in range(4)
        ],
        "kv_cache_index": {
            "enabled": True,
            "backend": "memory",
            "groups": [
                {"name": "chat", "backends": ["b0", "b1"], "mode": "approximate"},
                {"name": "fleet", "backends": ["b2", "b3"], "mode": "precise", "engine": "vllm", "hash_seed": "0"},
            ],
        },
    }


async def fill(nats_url: str, args: argparse.Namespace) -> tuple[int, int]:
    """Publish the history; (messages, bytes)."""
    rng = random.Random(args.seed)
    nc = await nats.connect(nats_url)
    count = size = 0
    try:
        js = nc.jetstream()
        await ensure_history_stream(js, RouteHistory(max_bytes=4 << 30, max_age=3600.0), 1)
        now = time.time()
        for c in range(args.conversations):
            replica = f"old-{c % 3}"
            chunks = [rng.getrandbits(63) for _ in range(args.turns * args.chunks_per_turn)]
            blocks = [rng.getrandbits(63) for _ in range(args.turns * args.blocks_per_turn)]
            backend = f"b{c % 2}"
            start = now - args.spread * rng.random()
            for t in range(1, args.turns + 1):
                ts = min(now, start + 30.0 * t)
                d = Decision(replica, "chat", backend, KIND_APPROXIMATE, ts, chunks[: t * args.chunks_per_turn], 300)
                k = Tokenized(
                    replica, "fleet", KIND_CHAT, rng.randbytes(16), blocks[: t * args.blocks_per_turn],
                    t * args.blocks_per_turn * 16, t * args.blocks_per_turn * 64,
                )  # fmt: skip
                for subject, payload in ((subject_for(replica), encode_decision(d)),
                                         (tokenized_subject_for(replica), encode_tokenized(k))):  # fmt: skip
                    await nc.publish(subject, payload)
                    count += 1
                    size += len(payload)
            if c % 200 == 0:
                await nc.flush()
        await nc.flush()
        async with asyncio.timeout(60):
            stored = 0
            while stored < count:  # the server stores core publishes after it acknowledges the flush
                await asyncio.sleep(0.1)
                stored = (await js.stream_info(HISTORY_STREAM)).state.messages
    finally:
        await nc.close()
    return count, size


async def probe(port: int, every_s: float, done: asyncio.Event) -> list[float]:
    """/healthz latencies (seconds) until `done` (and at least one)."""
    out: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        while not (done.is_set() and out):
            started = time.perf_counter()
            try:
                await client.get("/healthz")
                out.append(time.perf_counter() - started)
            except httpx.TransportError:  # not listening yet
                pass
            await asyncio.sleep(every_s)
    return out


async def replayed(proc: asyncio.subprocess.Process, done: asyncio.Event) -> tuple[int, float]:
    """Reads the ingress's log until its replay line: (messages, seconds)."""
    assert proc.stderr is not None
    async with asyncio.timeout(300):
        while True:
            line = (await proc.stderr.readline()).decode(errors="replace")
            if not line:
                raise RuntimeError("the ingress exited before its replay finished")
            found = REPLAYED.search(line)
            if found:
                done.set()
                return int(found.group(1)), float(found.group(2))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def start_once(path: Path, env: dict[str, str], probe_ms: float) -> dict[str, float]:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_router", "serve", "--config", str(path), "--port", str(port),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    done = asyncio.Event()
    try:
        probes = asyncio.create_task(probe(port, probe_ms / 1000, done))
        messages, seconds = await replayed(proc, done)
        async with asyncio.timeout(30):
            latencies = sorted(await probes)
        memory = rss_mb(proc.pid)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
    return {
        "messages": messages,
        "seconds": seconds,
        "per_second": messages / seconds if seconds else 0.0,
        "probes": len(latencies),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000,
        "max_ms": latencies[-1] * 1000,
        "rss_mb": memory,
    }


async def amain(args: argparse.Namespace) -> None:
    env = {**os.environ, "CONTINUUM_LOG_LEVEL": "INFO"}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server = NatsServer(data_dir=workdir / "nats")
        await server.start()
        try:
            count, size = await fill(server.url, args)
            path = workdir / "router.yaml"
            path.write_text(yaml.safe_dump(config(server.url)))
            runs = [await start_once(path, env, args.probe_ms) for _ in range(args.repeats)]
        finally:
            await server.close()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"history: {count} messages, {size / 1e6:.1f} MB ({args.conversations} conversations x {args.turns} turns)")
    print(f"replayed (median of {args.repeats} starts): {int(med['messages'])} messages in {med['seconds']:.2f} s "
          f"({med['per_second']:,.0f}/s, {size / 1e6 / med['seconds']:.1f} MB/s)")  # fmt: skip
    print(f"/healthz every {args.probe_ms:g} ms during the replay ({int(med['probes'])} answers): "
          f"p50 {med['p50_ms']:.2f} ms, p99 {med['p99_ms']:.2f} ms, max {med['max_ms']:.2f} ms")  # fmt: skip
    print(f"ingress resident memory after the replay: {med['rss_mb']:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--chunks-per-turn", type=int, default=20, help="256-byte text chunks a turn adds")
    parser.add_argument("--blocks-per-turn", type=int, default=75, help="16-token blocks a turn adds")
    parser.add_argument("--spread", type=float, default=300.0, help="seconds of history")
    parser.add_argument("--probe-ms", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
