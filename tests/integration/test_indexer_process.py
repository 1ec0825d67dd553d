"""`continuum-indexer` as a real process (SIGKILL mid-stream, restart, nothing lost), its CLI
errors, and the admin surface: NATS request/reply, /healthz and /metrics over loopback HTTP."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path

import httpx
import nats
import orjson
import yaml

from continuum_common.procs import NatsServer, RedisServer, free_port
from continuum_common.wire.kv import AllCleared, BlocksRemoved, BlocksStored
from continuum_indexer.app import IndexerApp
from continuum_testing.indexer_harness import (
    consumer_state,
    ensure_stream,
    publish,
    publish_batches,
    router_config,
    running,
    settings,
    snapshot,
    wait_drained,
)
from continuum_testing.kvindex_block_model import batch, universe
from continuum_testing.kvindex_streams import make_stream
from tests.integration.test_indexer_consumer import PREFIXES, expected, reader

BLOCKS = universe(16)


def write_config(path: Path, nats_url: str, redis_url: str, **kv: object) -> Path:
    data = {
        "bus": {"embedded": False, "url": nats_url},
        "redis": {"url": redis_url},
        "kv_cache_index": {"enabled": True, "backend": "redis", **kv},
    }
    path.write_text(yaml.safe_dump(data))
    return path


async def start_indexer(config: Path, port: int, *extra: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_indexer", "--config", str(config), "--listen", f"127.0.0.1:{port}", *extra,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"},
    )  # fmt: skip
    async with httpx.AsyncClient(timeout=1) as client:
        for _ in range(300):
            if proc.returncode is not None:
                raise AssertionError(f"indexer exited: {(await proc.stderr.read()).decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    proc.kill()
    raise AssertionError("indexer never became healthy")


async def test_killed_process_restarts_and_loses_nothing(
    tmp_path: Path, nats_server: NatsServer, redis_server: RedisServer
) -> None:
    events = make_stream(random.Random(11), backends=("a", "b", "c"), prefixes=PREFIXES, count=20_000)
    config = write_config(tmp_path / "router.yaml", nats_server.url, redis_server.url)
    await ensure_stream(nats_server.url)
    await publish(nats_server.url, events, dedupe=True)
    port = free_port()
    proc = await start_indexer(config, port, "--batch", "200", "--ack-wait", "1")
    try:
        while (await consumer_state(nats_server.url))[2] < 400:
            await asyncio.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    pending, _, floor = await consumer_state(nats_server.url)
    assert floor < len(events) and pending + floor <= len(events), "killed before the stream was consumed"

    proc = await start_indexer(config, port, "--batch", "200", "--ack-wait", "1")
    try:
        await wait_drained(nats_server.url, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0  # graceful stop
    index = reader(redis_server.url)
    try:
        assert await snapshot(index, PREFIXES) == expected(events)
    finally:
        await index.close()


async def test_refused_stream_create_is_retried_until_the_stream_exists(
    tmp_path: Path, nats_server: NatsServer, redis_server: RedisServer
) -> None:
    """A stream the servers refuse to create (here 3 replicas on one server; in a cluster, one
    still electing its leaders) keeps the indexer up and not ready, retrying with backoff, as the
    listener does; once the stream exists it binds and indexes."""
    events = make_stream(random.Random(13), backends=("a", "b"), prefixes=PREFIXES, count=300)
    config = write_config(tmp_path / "router.yaml", nats_server.url, redis_server.url)
    data = yaml.safe_load(config.read_text())
    data["bus"]["stream"] = {"replicas": 3}
    config.write_text(yaml.safe_dump(data))
    port = free_port()
    log = tmp_path / "indexer.log"
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "continuum_indexer", "--config", str(config), "--listen", f"127.0.0.1:{port}",
            stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
            env={**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"},
        )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=1) as client:
            async with asyncio.timeout(20):
                while log.read_text().count("cannot bind consumer") < 3:
                    assert proc.returncode is None, f"indexer exited: {log.read_text()[-2000:]}"
                    await asyncio.sleep(0.05)
            refused = await client.get("/healthz")
            assert proc.returncode is None
            await ensure_stream(nats_server.url)  # as an operator (or a listener) would
            await publish(nats_server.url, events, dedupe=True)
            await wait_drained(nats_server.url, timeout=30)
            healthy = await client.get("/healthz")
    finally:
        proc.send_signal(signal.SIGTERM)
        stopped = await asyncio.wait_for(proc.wait(), 15)
    assert refused.status_code == 503 and refused.json()["consumer_bound"] is False
    assert healthy.status_code == 200 and healthy.json()["consumer_bound"] is True
    assert stopped == 0
    index = reader(redis_server.url)
    try:
        assert await snapshot(index, PREFIXES) == expected(events)
    finally:
        await index.close()


async def test_cli_refuses_configs_it_cannot_serve(tmp_path: Path) -> None:
    memory = tmp_path / "memory.yaml"
    memory.write_text(yaml.safe_dump({"kv_cache_index": {"enabled": True, "backend": "memory"}}))
    off = tmp_path / "off.yaml"
    off.write_text(yaml.safe_dump({"kv_cache_index": {"enabled": False}}))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"kv_cache_index": {"enabled": True, "max_entries": 5}}))
    for path, needle in ((memory, "embedded"), (off, "enabled is false"), (bad, "kv_cache_index.max_entries")):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "continuum_indexer", "--config", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
        assert proc.returncode == 2, err
        assert needle in err.decode()


async def test_admin_health_and_metrics(nats_server: NatsServer, redis_server: RedisServer) -> None:
    events = make_stream(random.Random(12), backends=("a", "b"), prefixes=PREFIXES, count=500)
    config = router_config(nats_server.url, redis_server.url)
    port = free_port()
    app = IndexerApp(settings(config, listen=("127.0.0.1", port)))
    blocks = [
        batch("a", 1, AllCleared(), BlocksStored(BLOCKS[:6]), epoch=3),
        batch("a", 2, BlocksRemoved(BLOCKS[:1]), epoch=3),
    ]
    async with running(app):
        await publish(nats_server.url, events, dedupe=True)
        await publish_batches(nats_server.url, blocks, dedupe=True)
        await wait_drained(nats_server.url)
        assert app.feeds is not None
        await app.feeds.maintain_once()  # the block snapshot /healthz shows
        nc = await nats.connect(nats_server.url)
        try:
            stats = orjson.loads((await nc.request("continuum.indexer.admin.stats", b"", timeout=5)).data)
            backends = orjson.loads((await nc.request("continuum.indexer.admin.backends", b"", timeout=5)).data)
            unknown = orjson.loads((await nc.request("continuum.indexer.admin.nope", b"", timeout=5)).data)
            assert app.index is not None
            before = (await app.index.stats()).entry_count
            cleared = orjson.loads((await nc.request("continuum.indexer.admin.clear", b"", timeout=5)).data)
        finally:
            await nc.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            health = await client.get("/healthz")
            metrics = (await client.get("/metrics")).text
            for _ in range(40):  # the loop-lag timer ticks every 0.1 s
                if "continuum_indexer_event_loop_lag_seconds_count 0.0" not in metrics:
                    break
                await asyncio.sleep(0.05)
                metrics = (await client.get("/metrics")).text
            missing = await client.get("/nothing")
            post = await client.post("/metrics")
        after = await snapshot(app.index, PREFIXES)

    assert stats["enabled"] is True and stats["config"]["backend"] == "redis"
    assert stats["index"]["prefix_count"] > 0 and stats["index"]["entry_count"] >= stats["index"]["prefix_count"]
    assert stats["consumer"]["num_pending"] == 0 and stats["event_sources"][0]["backend_name"] == "event_bus"
    by_name = {row["backend_name"]: row for row in backends["backends"]}
    assert set(by_name) == {"a", "b"}
    sent = {b: sum(1 for e in events if e.backend == b) for b in ("a", "b")}
    assert {b: by_name[b]["events"]["received"] for b in ("a", "b")} == sent
    assert by_name["a"]["events"]["index_created"] > 0
    assert unknown["success"] is False and unknown["error"]["type"] == "unknown_verb"
    assert cleared == {
        "success": True,
        "entries_before_clear": before,
        "cleared_entries": cleared["cleared_entries"],
        "cleared_blocks": 5,
    }
    assert cleared["cleared_entries"] > 0 and not any(after.values())
    row = stats["blocks"]["backends"]["a"]
    assert stats["blocks"]["block_count"] == 5 and set(stats["blocks"]["backends"]) == {"a"}
    assert (row["gpu_blocks"], row["storage_blocks"], row["source_epoch"], row["batches"]) == (5, 0, 3, 2)
    assert (row["applied"], row["stale"], row["clears"]) == (7, 0, 1) and row["generation"] > 0
    assert 0 <= row["last_batch_age_s"] < 30
    assert health.status_code == 200 and health.json()["consumer_bound"] is True
    assert health.json()["blocks"]["backends"]["a"]["gpu_blocks"] == 5
    assert 'continuum_kv_block_events_received_total{backend="a"} 7.0' in metrics
    assert 'continuum_kv_block_events_applied_total{result="applied"} 7.0' in metrics
    assert 'continuum_kv_block_index_blocks{tier="gpu"} 5.0' in metrics
    assert "continuum_kv_events_received_total" in metrics
    assert 'continuum_kv_consumer_connected{backend="event_bus"} 1.0' in metrics
    assert "continuum_kv_index_apply_seconds_bucket" in metrics
    assert "continuum_indexer_event_loop_lag_seconds_count" in metrics
    assert "continuum_indexer_event_loop_lag_seconds_count 0.0" not in metrics
    assert missing.status_code == 404 and post.status_code == 405
