"""Helpers for the indexer tests: configs, publishing, running IndexerApp, waiting for the
durable consumer to drain, and reading the whole index back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import nats
from nats.js.errors import NotFoundError

from continuum_common.config.loader import parse
from continuum_common.config.router import RouterConfig
from continuum_common.events import STREAM_NAME, SUBJECT_PREFIX, KvEvent
from continuum_common.kvindex import KvHolder, KvIndex
from continuum_common.wire.kv import KvBatch, encode_batch
from continuum_indexer.app import IndexerApp
from continuum_indexer.config import ConsumerSettings, IndexerSettings
from continuum_testing.kvindex_streams import prefix


def router_config(
    nats_url: str,
    redis_url: str | None = None,
    *,
    cluster: bool = False,
    backend: str = "redis",
    **kv: Any,
) -> RouterConfig:
    data: dict[str, Any] = {
        "bus": {"embedded": False, "url": nats_url},
        "kv_cache_index": {"enabled": True, "backend": backend, **kv},
        "backends": [{"name": n, "url": f"http://127.0.0.1:1/{n}"} for n in ("a", "b", "c")],
    }
    if redis_url is not None:
        data["redis"] = {"url": redis_url, "cluster": cluster, "command_timeout_ms": 2000}
    return parse(RouterConfig, data)


def settings(
    config: RouterConfig, *, batch: int = 500, listen: tuple[str, int] | None = None, **consumer: Any
) -> IndexerSettings:
    return IndexerSettings(
        config=config,
        consumer=ConsumerSettings(batch=batch, max_ack_pending=max(4 * batch, 1000), **consumer),
        listen=listen,
        maintenance_interval_s=0.5,
        shutdown_grace_s=5.0,
    )


async def publish(nats_url: str, events: Iterable[KvEvent], *, dedupe: bool = False) -> None:
    """Publish with JetStream acks. Without `dedupe` no Nats-Msg-Id is sent, so duplicates
    reach the indexer (its own idempotency is what the tests check)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        pending = []
        for event in events:
            headers = {"Nats-Msg-Id": event.msg_id} if dedupe else None
            pending.append(await js.publish_async(event.subject, event.encode(), headers=headers))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await nc.close()


async def publish_batches(nats_url: str, batches: Iterable[KvBatch], *, dedupe: bool = False) -> None:
    """Publish version-2 KV batches as a listener does (subject per backend, Msg-Id when
    `dedupe`), with JetStream acks."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        pending = []
        for batch in batches:
            headers = {"Nats-Msg-Id": batch.msg_id} if dedupe else None
            pending.append(await js.publish_async(SUBJECT_PREFIX + batch.backend, encode_batch(batch), headers=headers))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await nc.close()


async def ensure_stream(nats_url: str) -> None:
    from continuum_common.bus import ensure_kv_stream
    from continuum_common.config.router import Bus

    nc = await nats.connect(nats_url)
    try:
        await ensure_kv_stream(nc.jetstream(), Bus(embedded=False, url=nats_url))
    finally:
        await nc.close()


async def consumer_state(nats_url: str, durable: str = "continuum-indexer") -> tuple[int, int, int]:
    """(num_pending, num_ack_pending, ack floor stream seq) of the durable consumer."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info(STREAM_NAME, durable)
        return info.num_pending or 0, info.num_ack_pending or 0, info.ack_floor.stream_seq if info.ack_floor else 0
    finally:
        await nc.close()


async def wait_drained(nats_url: str, timeout: float = 30.0, durable: str = "continuum-indexer") -> None:
    """Until the durable consumer has settled every message of the stream. "Nothing pending"
    alone is not enough: the server tells a consumer about a stored message asynchronously
    (right after a publish is acknowledged its num_pending can still read 0), and a nak'd
    message waiting for its redelivery counts as neither pending nor unacknowledged."""
    deadline = time.monotonic() + timeout
    state: Any = None
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        while time.monotonic() < deadline:
            with contextlib.suppress(NotFoundError):
                info = await js.consumer_info(STREAM_NAME, durable)
                last = (await js.stream_info(STREAM_NAME)).state.last_seq or 0
                floor = info.ack_floor.stream_seq if info.ack_floor else 0
                state = (info.num_pending or 0, info.num_ack_pending or 0, floor, last)
                if state[0] == 0 and state[1] == 0 and floor >= last:
                    return
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    raise AssertionError(f"consumer did not drain in {timeout}s: (pending, unacked, ack floor, last) = {state}")


@contextlib.asynccontextmanager
async def running(app: IndexerApp) -> AsyncIterator[asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await asyncio.wait_for(_started(app, task), 15)
        yield task
    finally:
        stop.set()
        if not task.done():
            try:
                await asyncio.wait_for(task, 15)
            except TimeoutError:
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _started(app: IndexerApp, task: asyncio.Task[None]) -> None:
    while not (app.started.is_set() and app.feeds is not None and app.feeds.consumer.ready.is_set()):
        if task.done():
            task.result()
        await asyncio.sleep(0.01)


async def snapshot(index: KvIndex, prefixes: int) -> dict[str, list[KvHolder]]:
    return await index.query_many([prefix(i) for i in range(prefixes)])
