"""Shared set-up of the indexer benchmarks: real nats-server and redis-server processes, the
`continuum-indexer` console entry point as its own process, and realistic event streams
(version-1 prefix-key events, and version-2 vLLM-shaped block batches)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import os
import random
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import yaml
from nats.aio.client import Client as NatsClient

from continuum_common.bus import ensure_kv_stream
from continuum_common.config.router import Bus
from continuum_common.events import STREAM_NAME, SUBJECT_PREFIX, EventType, KvEvent, Tier
from continuum_common.procs import NatsServer, RedisServer, free_port
from continuum_common.wire.kv import AllCleared, BlockEvent, BlocksRemoved, BlocksStored, KvBatch, encode_batch


def prefix(i: int) -> str:
    return hashlib.sha256(f"bench-prefix-{i}".encode()).hexdigest()


def workload(count: int, *, backends: int = 8, prefixes: int = 50_000, seed: int = 1) -> list[KvEvent]:
    """What a busy fleet emits: mostly created/updated, some evictions and offloads."""
    rng = random.Random(seed)
    names = [f"vllm-{i}" for i in range(backends)]
    seqs = dict.fromkeys(names, 0)
    keys = [prefix(i) for i in range(prefixes)]
    out = []
    for _ in range(count):
        backend = rng.choice(names)
        seqs[backend] += 1
        roll = rng.random()
        etype = EventType.CREATED if roll < 0.6 else EventType.UPDATED if roll < 0.85 else EventType.EVICTED
        out.append(
            KvEvent(
                backend, 1, seqs[backend], 0.0, etype, rng.choice(keys), rng.choice((256, 1024, 4096)), Tier.GPU_HOT
            )
        )
    return out


def block_workload(
    blocks: int, *, backends: int = 8, capacity: int = 4000, seed: int = 1, epoch: int = 1
) -> list[KvBatch]:
    """vLLM-shaped KV batches carrying about `blocks` block events: per engine step 1-3
    BlockStored of a request's new full blocks (20-200 hashes each) and, once the engine's
    cache holds `capacity` blocks, one single-hash BlockRemoved per block it evicts (the
    least recently stored). The first batch of each backend starts with AllCleared."""
    rng = random.Random(seed)
    names = [f"vllm-{i}" for i in range(backends)]
    seqs = dict.fromkeys(names, 0)
    cached: dict[str, collections.deque[int]] = {n: collections.deque() for n in names}
    out: list[KvBatch] = []
    total = 0
    while total < blocks:
        name = rng.choice(names)
        seqs[name] += 1
        events: list[BlockEvent] = [AllCleared()] if seqs[name] == 1 else []
        held = cached[name]
        for _ in range(rng.randint(1, 3)):
            hashes = [rng.getrandbits(64) for _ in range(rng.randint(20, 200))]
            events.append(BlocksStored(hashes, parent=None, block_tokens=16))
            held.extend(hashes)
            total += len(hashes)
        while len(held) > capacity:
            events.append(BlocksRemoved([held.popleft()]))
            total += 1
        out.append(KvBatch(name, epoch, seqs[name], 0.0, events))
    return out


def block_events(batches: list[KvBatch]) -> list[int]:
    """Cumulative block events after each batch (index i = the first i + 1 batches)."""
    return list(itertools.accumulate(b.block_count for b in batches))


async def publish_batches(nats_url: str, batches: list[KvBatch]) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    pending = []
    for batch in batches:
        pending.append(await js.publish_async(SUBJECT_PREFIX + batch.backend, encode_batch(batch)))
        if len(pending) >= 2000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    await nc.close()


@contextlib.asynccontextmanager
async def servers() -> AsyncIterator[tuple[NatsServer, RedisServer]]:
    nats_server, redis_server = NatsServer(), RedisServer()
    await nats_server.start()
    await redis_server.start()
    try:
        nc = await nats.connect(nats_server.url)
        await ensure_kv_stream(nc.jetstream(), Bus(embedded=False, url=nats_server.url, stream={"max_bytes": 4 << 30}))
        await nc.close()
        yield nats_server, redis_server
    finally:
        await nats_server.close()
        await redis_server.close()


@contextlib.asynccontextmanager
async def indexer_process(nats_url: str, redis_url: str, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    workdir = Path(tempfile.mkdtemp(prefix="continuum-bench-"))
    config = workdir / "router.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "bus": {"embedded": False, "url": nats_url},
                "redis": {"url": redis_url, "pool_size": 8},
                "prefix_routing": {"enabled": True},
                "kv_cache_index": {"enabled": True, "backend": "redis", "max_entries": 1_000_000},
            }
        )
    )
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_indexer", "--config", str(config), "--listen", f"127.0.0.1:{port}", *args,
        env={**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"},
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(timeout=1) as client:
            for _ in range(400):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError("the indexer did not become healthy")
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def publish_all(nats_url: str, events: list[KvEvent]) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    pending = []
    for event in events:
        pending.append(await js.publish_async(event.subject, event.encode()))
        if len(pending) >= 5000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    await nc.close()


async def consumer_progress(nc: NatsClient, durable: str = "continuum-indexer") -> tuple[int, int]:
    """(acked stream sequence floor, messages still pending or unacked)."""
    info = await nc.jetstream().consumer_info(STREAM_NAME, durable)
    return info.ack_floor.stream_seq if info.ack_floor else 0, (info.num_pending or 0) + (info.num_ack_pending or 0)


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pid(server: NatsServer | RedisServer) -> int:
    proc = server._proc  # the harness keeps the child process; the benchmark only reads its pid
    assert proc is not None
    return proc.pid
