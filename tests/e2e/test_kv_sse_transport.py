"""The listener's seed-compatible SSE endpoint (`GET /events/{backend}`) read by the indexer's
SSE transport (`kv_cache_index.event_sources[].transport: sse`), both real, over loopback HTTP,
fed by a simulated vLLM engine: the snapshot a new consumer gets, the live feed, a resume with
`Last-Event-ID` after a disconnect (no second snapshot), and AllBlocksCleared."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from continuum_common.config.kv_index import EventSource
from continuum_common.config.listener import ListenerConfig
from continuum_common.kvindex import InMemoryKvIndex
from continuum_common.salt import make_salt
from continuum_indexer.adapters.sse_source import SseSource
from continuum_indexer.event_sink import EventSink
from continuum_indexer.metrics import IndexerMetrics
from continuum_listener.app import running
from continuum_listener.config import settings_from
from continuum_sim import SimFleet
from continuum_testing.kv_stack import SECRET, SECRET_ENV, chat, key_of, words


@contextlib.asynccontextmanager
async def consuming(source: SseSource) -> AsyncIterator[SseSource]:
    task = asyncio.create_task(source.run())
    try:
        yield source
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(check: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.02)


async def test_listener_sse_feeds_the_indexer_sse_transport(monkeypatch: Any) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    async with SimFleet(1, time_scale=0.001) as fleet, httpx.AsyncClient(timeout=30) as http:
        backend = fleet.endpoints[0].name
        (source_cfg,) = fleet.listener_sources()
        source_cfg["prefix_key_mode"] = "salt_echo"
        source_cfg["publish"] = "prefix"  # the SSE feed carries prefix-key events
        cfg = ListenerConfig.model_validate(
            {"listen": "127.0.0.1:0", "salt": {"secret_env": SECRET_ENV}, "limits": {"coalesce_window_ms": 10},
             "sources": [source_cfg]}
        )  # fmt: skip
        async with running(settings_from(cfg)) as listener:
            index = InMemoryKvIndex()
            sink = EventSink(index, IndexerMetrics([backend]))
            endpoint = f"http://127.0.0.1:{listener.port}/events/{backend}"
            event_source = EventSource(backend_name=backend, endpoint=endpoint, reconnect_interval_ms=50)

            async def warm(tag: str, max_tokens: int = 4) -> str:
                body = chat(f"System prompt {tag}. " + words(tag, 60), "hello", max_tokens)
                salt = make_salt(SECRET.encode(), backend, bytes.fromhex(key_of(body)))
                response = await http.post(fleet.urls[0] + "/v1/chat/completions", json={**body, "cache_salt": salt})
                assert response.status_code == 200
                return key_of(body)

            async def announced(key: str) -> int:
                return next((e.token_count for e in listener.pipelines[backend].snapshot() if e.prefix_hash == key), 0)

            async def held(key: str) -> int:
                rows = await index.query_backends(key)
                return rows[0].token_count if rows else 0

            # Cached before the consumer connects: it arrives in the snapshot.
            early = await warm("early", max_tokens=40)
            await until(lambda: _positive(announced(early)))
            first = SseSource(event_source, sink)
            async with consuming(first):
                await until(lambda: _positive(held(early)))
                assert await held(early) == await announced(early)
                live = await warm("live")  # the live feed
                await until(lambda: _positive(held(live)))
                assert await held(live) == await announced(live)
            assert (await index.backend_counters())[backend].clears == 1  # the snapshot's `cleared`
            resume_from = first.last_event_id
            assert resume_from is not None

            missed = await warm("missed")  # while nobody is connected
            await until(lambda: _positive(announced(missed)))
            second = SseSource(event_source, sink)
            second.last_event_id = resume_from
            async with consuming(second):
                await until(lambda: _positive(held(missed)))
                # Resumed from the history: no second snapshot, so no second `cleared`.
                assert (await index.backend_counters())[backend].clears == 1
                assert await held(early) > 0 and await held(live) > 0
                assert (await http.post(fleet.urls[0] + "/reset_prefix_cache")).status_code == 200
                await until(lambda: _zero(held(early)))
                assert await held(live) == 0 and await held(missed) == 0
            assert (await index.backend_counters())[backend].clears == 2


async def _positive(value: Any) -> bool:
    return bool(await value > 0)


async def _zero(value: Any) -> bool:
    return bool(await value == 0)
