"""The gemini-cache service end to end: real nats-server, real redis-server, the fake Gemini
API on loopback HTTP, the service's own composition root. Time moves by a shared fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
import pytest_asyncio

from continuum_common.procs import NatsServer, RedisServer
from continuum_common.wire.gemini import EnsureOutcome, LookupResult
from continuum_gemini_cache.app import GeminiCacheApp
from continuum_testing.fake_gemini import FakeGemini, Op
from continuum_testing.gemini_cache import (
    API_KEY,
    KEY_ENV,
    MODEL,
    FakeClock,
    GeminiBusClient,
    router_config,
    system_prompt,
    wait_for,
)

AppFactory = Callable[..., AbstractAsyncContextManager[GeminiCacheApp]]


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    yield


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest_asyncio.fixture(loop_scope="session")
async def fake(clock: FakeClock) -> AsyncIterator[FakeGemini]:
    async with FakeGemini(clock=clock, api_keys={API_KEY}) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def bus(nats_server: NatsServer) -> AsyncIterator[GeminiBusClient]:
    client = await GeminiBusClient.connect(nats_server.url)
    yield client
    await client.close()


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_app(fake: FakeGemini, nats_server: NatsServer, redis_server: RedisServer, clock: FakeClock) -> AppFactory:
    @asynccontextmanager
    async def factory(state: str = "redis", **cache: Any) -> AsyncIterator[GeminiCacheApp]:
        redis_url = redis_server.url if state == "redis" else None
        cfg = router_config(fake.url, nats_server.url, redis_url=redis_url, **cache)
        app = GeminiCacheApp(cfg, clock=clock)
        await app.start()
        try:
            yield app
        finally:
            await app.stop()

    return factory


def deletes_done(app: GeminiCacheApp) -> float:
    value = app.metrics.registry.get_sample_value(
        "continuum_gemini_context_cache_deletes_total", {"backend": "gem-a", "result": "ok"}
    )
    return value or 0.0


async def test_miss_then_one_create_then_hit(
    make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini, state: str
) -> None:
    system = system_prompt()
    async with make_app(state):
        first = await bus.lookup(system)
        assert first.result is LookupResult.MISS and not first.in_flight
        created = await bus.ensure(system)
        assert created.outcome is EnsureOutcome.CREATED and created.cached_content
        assert fake.count(Op.CREATE) == 1
        call = fake.calls_for(Op.CREATE)[0]
        assert call.api_key == API_KEY and call.status == 200
        assert call.body["model"] == f"models/{MODEL}" and call.body["ttl"] == "600s"
        assert call.body["systemInstruction"] == {"parts": [{"text": system}], "role": "user"}
        hit = await bus.lookup(system)
        assert hit.result is LookupResult.HIT and hit.cached_content == created.cached_content
        assert hit.token_count == fake.caches[created.cached_content].token_count
        assert hit.expire_at == pytest.approx(fake.caches[created.cached_content].expire_at, abs=1e-3)
        again = await bus.ensure(system)
        assert again.outcome is EnsureOutcome.EXISTS and again.cached_content == created.cached_content
        assert (await bus.lookup(system, model="gemini-2.5-pro")).result is LookupResult.MISS  # digest has the model
        assert fake.count(Op.CREATE) == 1


async def test_fifty_concurrent_ensures_on_two_replicas_make_one_create(
    make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini
) -> None:
    system = system_prompt(1)
    fake.inject(Op.CREATE, status=None, delay=0.4)  # a slow create keeps every other ensure concurrent
    async with make_app("redis") as one, make_app("redis") as two:
        replies = await asyncio.gather(*(bus.ensure(system) for _ in range(50)))
        outcomes = [r.outcome for r in replies]
        assert outcomes.count(EnsureOutcome.CREATED) == 1
        assert set(outcomes) <= {EnsureOutcome.CREATED, EnsureOutcome.IN_FLIGHT, EnsureOutcome.EXISTS}
        assert fake.count(Op.CREATE) == 1
        handled = [
            sum(s.value for m in app.metrics.ensures.collect() for s in m.samples if s.name.endswith("_total"))
            for app in (one, two)
        ]
        assert sum(handled) == 50 and min(handled) > 0  # the queue group spread them over both
        assert (await bus.lookup(system)).result is LookupResult.HIT
        published = [bus.publish_ensure(system) for _ in range(20)]  # fire-and-forget, as the ingress does
        await asyncio.gather(*published)
        await asyncio.sleep(0.2)
        assert fake.count(Op.CREATE) == 1


async def test_rejected_prefix_is_negative_for_negative_ttl(
    make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini, clock: FakeClock, state: str
) -> None:
    fake.min_cache_tokens = 100_000
    system = system_prompt(2)
    async with make_app(state, negative_ttl_seconds=120):
        rejected = await bus.ensure(system)
        assert rejected.outcome is EnsureOutcome.REJECTED and rejected.min_total_token_count == 100_000
        negative = await bus.lookup(system)
        assert negative.result is LookupResult.NEGATIVE and negative.min_total_token_count == 100_000
        assert negative.negative_until == pytest.approx(clock() + 120, abs=1)
        for _ in range(5):
            assert (await bus.ensure(system)).outcome is EnsureOutcome.NEGATIVE
        clock.advance(100)
        assert (await bus.ensure(system)).outcome is EnsureOutcome.NEGATIVE
        assert fake.count(Op.CREATE) == 1  # no create attempt during the negative TTL
        clock.advance(21)
        assert (await bus.lookup(system)).result is LookupResult.MISS
        fake.min_cache_tokens = 1024
        assert (await bus.ensure(system)).outcome is EnsureOutcome.CREATED
        assert fake.count(Op.CREATE) == 2


async def test_transient_failures_record_nothing_and_are_retried(
    make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini
) -> None:
    system = system_prompt(3)
    async with make_app("redis", create_timeout_ms=500):
        fake.inject(Op.CREATE, 503)
        failed = await bus.ensure(system)
        assert failed.outcome is EnsureOutcome.FAILED and failed.error == "http_5xx"
        assert (await bus.lookup(system)).result is LookupResult.MISS
        fake.inject(Op.CREATE, status=None, delay=1.0)  # longer than create_timeout_ms
        timed_out = await bus.ensure(system)
        assert timed_out.outcome is EnsureOutcome.FAILED and timed_out.error == "timeout"
        assert (await bus.lookup(system)).result is LookupResult.MISS
        assert (await bus.ensure(system)).outcome is EnsureOutcome.CREATED
        stats = await bus.stats()
        assert stats["create_failures"] == 2 and stats["creates"] == 1 and stats["negative_entries"] == 0


async def test_lru_eviction_deletes_the_evicted_cache(
    make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini, clock: FakeClock, state: str
) -> None:
    async with make_app(state, max_entries=10) as app:
        names = []
        for i in range(10):
            names.append((await bus.ensure(system_prompt(100 + i))).cached_content)
            clock.advance(1)
        await bus.lookup(system_prompt(100))  # the first one is used again: the second is now the LRU
        clock.advance(1)
        assert (await bus.ensure(system_prompt(200))).outcome is EnsureOutcome.CREATED
        await wait_for(lambda: deletes_done(app) == 1)
        assert fake.count(Op.DELETE) == 1
        assert fake.calls_for(Op.DELETE)[0].path == f"/v1beta/{names[1]}"
        assert fake.calls_for(Op.DELETE)[0].status == 200 and names[1] not in fake.caches
        assert (await bus.lookup(system_prompt(101))).result is LookupResult.MISS
        assert (await bus.lookup(system_prompt(100))).result is LookupResult.HIT
        stats = await bus.stats()
        assert stats["entries"] == 10 and stats["evictions"] == 1 and stats["deletes"] == 1


async def test_extend_on_hit_sends_exactly_one_patch(
    make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini, clock: FakeClock, state: str
) -> None:
    system = system_prompt(4)
    async with make_app(state, extend_on_hit=True, ttl="10m"):
        created = await bus.ensure(system)
        clock.advance(400)  # 200 s of 600 left (33 %): no extension yet
        assert (await bus.lookup(system)).result is LookupResult.HIT
        await asyncio.sleep(0.1)
        assert fake.count(Op.PATCH) == 0
        clock.advance(100)  # 100 s left (17 %)
        hits = await asyncio.gather(*(bus.lookup(system) for _ in range(20)))
        assert all(h.result is LookupResult.HIT for h in hits), [h for h in hits if not h.hit]
        await wait_for(lambda: fake.count(Op.PATCH) == 1)
        await asyncio.sleep(0.2)
        for _ in range(5):
            await bus.lookup(system)
        await asyncio.sleep(0.1)
        assert fake.count(Op.PATCH) == 1
        patch = fake.calls_for(Op.PATCH)[0]
        assert patch.body == {"ttl": "600s"} and patch.query == {"updateMask": "ttl"} and patch.status == 200
        assert patch.path == f"/v1beta/{created.cached_content}"
        extended = await bus.lookup(system)
        assert extended.expire_at == pytest.approx(clock() + 600, abs=1)


async def test_restart_keeps_entries_in_redis(make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini) -> None:
    system = system_prompt(5)
    async with make_app("redis"):
        created = await bus.ensure(system)
        await bus.stats()  # counters are flushed to Redis
    async with make_app("redis"):
        hit = await bus.lookup(system)
        assert hit.result is LookupResult.HIT and hit.cached_content == created.cached_content
        assert (await bus.ensure(system)).outcome is EnsureOutcome.EXISTS
        stats = await bus.stats()
        assert stats["entries"] == 1 and stats["creates"] == 1
    assert fake.count(Op.CREATE) == 1


async def test_stale_reference_is_dropped_and_recreated(
    make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini, state: str
) -> None:
    system = system_prompt(6)
    async with make_app(state):
        created = await bus.ensure(system)
        name = created.cached_content
        assert name is not None
        assert not (await bus.drop(system, "cachedContents/somethingelse")).dropped  # a late, stale report
        assert (await bus.lookup(system)).result is LookupResult.HIT
        del fake.caches[name]  # Google expired or deleted it; the ingress got a 403 for it
        assert (await bus.drop(system, name)).dropped
        assert (await bus.lookup(system)).result is LookupResult.MISS
        recreated = await bus.ensure(system)
        assert recreated.outcome is EnsureOutcome.CREATED and recreated.cached_content != name
        assert fake.count(Op.CREATE) == 2
        assert (await bus.stats())["stale"] == 1


async def test_admin_stats_usage_and_clear(
    make_app: AppFactory, bus: GeminiBusClient, fake: FakeGemini, state: str
) -> None:
    from continuum_common.wire.gemini import RequestOutcome, UsageAccumulator

    async with make_app(state, max_entries=50) as app:
        a = await bus.ensure(system_prompt(7))
        b = await bus.ensure(system_prompt(8))
        fake.min_cache_tokens = 10**9
        assert (await bus.ensure(system_prompt(9))).outcome is EnsureOutcome.REJECTED
        await bus.lookup(system_prompt(7))
        acc = UsageAccumulator()
        acc.record("gem-a", RequestOutcome.HIT, cached_tokens=5000)
        acc.record("gem-a", RequestOutcome.MISS)
        acc.record("gem-a", RequestOutcome.INELIGIBLE)
        acc.record("nope", RequestOutcome.HIT)  # not a configured backend: counted drop
        report = acc.drain()
        assert report is not None
        await bus.usage(report)
        await asyncio.sleep(0.1)
        stats = await bus.stats()
        assert stats["enabled"] is True and stats["state_backend"] == state
        assert stats["config"]["max_entries"] == 50 and stats["config"]["ttl"] == "10m"
        assert (stats["entries"], stats["negative_entries"], stats["in_flight"]) == (2, 1, 0)
        expected = {"hit": 1, "miss": 1, "ineligible": 1, "negative": 0, "creates": 2, "create_failures": 1}
        assert {k: stats[k] for k in expected} == expected
        assert stats["evictions"] == 0 and stats["cached_tokens"] == 5000
        assert stats["lookups"] == {"hit": 1, "miss": 0, "negative": 0}
        assert stats["backends"]["gem-a"]["entries"] == 2 and stats["backends"]["gem-a"]["creates"] == 2
        assert "nope" not in stats["backends"]
        cleared = await bus.clear()
        assert cleared.success and cleared.cleared_entries == 2 and cleared.cleared_negative_entries == 1
        await wait_for(lambda: deletes_done(app) == 2)
        assert fake.count(Op.DELETE) == 2
        deleted = {c.path.removeprefix("/v1beta/") for c in fake.calls_for(Op.DELETE)}
        assert deleted == {a.cached_content, b.cached_content} and not fake.live_caches()
        after = await bus.stats()
        assert (after["entries"], after["negative_entries"]) == (0, 0)
        assert (await bus.lookup(system_prompt(7))).result is LookupResult.MISS
