"""Issue 8's done-when, end to end: the official openai SDK -> the real ingress on loopback ->
the fake Gemini API, with the real gemini-cache service on a real nats-server and redis-server.
Time at Google and in the service moves by a shared fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import pytest_asyncio

from continuum_common.procs import NatsServer, RedisServer
from continuum_testing.fake_gemini import FakeGemini, Op
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, FakeClock, system_prompt, wait_for
from continuum_testing.gemini_ingress_stack import ADMIN_ENV, ADMIN_TOKEN, GeminiStack, gemini_stack

StackFactory = Callable[..., AbstractAsyncContextManager[GeminiStack]]


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    yield


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest_asyncio.fixture(loop_scope="session")
async def fake(clock: FakeClock) -> AsyncIterator[FakeGemini]:
    async with FakeGemini(clock=clock, api_keys={API_KEY}) as server:
        yield server


@pytest.fixture
def stack(fake: FakeGemini, clock: FakeClock, nats_server: NatsServer, redis_server: RedisServer) -> StackFactory:
    def factory(**cache: Any) -> AbstractAsyncContextManager[GeminiStack]:
        return gemini_stack(fake, clock, nats_server.url, redis_url=redis_server.url, **cache)

    return factory


def _cached(response: Any) -> int:
    details = response.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def _compat_ref(call: Any) -> str | None:
    extra = call.body.get("extra_body") or {}
    return (extra.get("google") or {}).get("cached_content")


async def test_first_request_goes_uncached_then_the_next_uses_the_cache(stack: StackFactory) -> None:
    async with stack() as s:
        system = system_prompt(1)
        first = await s.chat(system)
        assert first.choices[0].message.content == s.fake.reply_text
        assert _cached(first) == 0
        (call,) = s.upstream_calls()
        # Forwarded at once, as the client sent it (system prompt included, no reference).
        assert call.op is Op.OPENAI_CHAT and call.body["messages"][0]["role"] == "system"
        assert _compat_ref(call) is None
        await s.wait_creates(1)  # one create, in the background
        await s.wait_stored(1)
        (cache,) = s.fake.live_caches().values()

        second = await s.chat(system, "And again?")
        call = s.upstream_calls()[-1]
        assert _compat_ref(call) == cache.name
        assert [m["role"] for m in call.body["messages"]] == ["user"]
        assert _cached(second) == cache.token_count
        assert second.usage.prompt_tokens > cache.token_count  # prompt_tokens stays the full count
        assert s.fake.count(Op.CREATE) == 1

        stats = await s.stats()
        assert stats["enabled"] is True and stats["creates"] == 1 and stats["entries"] == 1
        assert stats["hit"] == 1 and stats["miss"] == 1 and stats["cached_tokens"] == cache.token_count
        metrics = (await s.admin.get(f"{s.ingress.url}/metrics")).text
        assert 'continuum_ingress_gemini_context_cache_requests_total{backend="gem-a",result="hit"} 1.0' in metrics
        assert (
            f'continuum_ingress_gemini_context_cache_cached_tokens_total{{backend="gem-a"}} {cache.token_count}.0'
            in (metrics)
        )

        # Clear: the service forgets the entry and DELETEs the resource (storage billing stops).
        cleared = await s.admin.post("/gemini-context-cache/clear")
        assert cleared.json() == {"success": True, "cleared_entries": 1, "cleared_negative_entries": 0}
        await wait_for(lambda: s.fake.count(Op.DELETE, status=200) == 1)
        assert not s.fake.live_caches()
        unauthorized = await s.admin.post("/gemini-context-cache/clear", headers={"authorization": "Bearer nope"})
        assert unauthorized.status_code == 401


async def test_fifty_concurrent_first_requests_make_one_create(stack: StackFactory) -> None:
    async with stack() as s:
        system = system_prompt(2)
        answers = await asyncio.gather(*(s.chat(system, f"question {i}") for i in range(50)))
        assert all(a.choices[0].message.content for a in answers)
        await s.wait_creates(1)
        await asyncio.sleep(0.3)  # any further create would have been sent by now
        assert s.fake.count(Op.CREATE) == 1


async def test_a_rejected_create_is_not_retried_during_the_negative_ttl(stack: StackFactory) -> None:
    async with stack(negative_ttl_seconds=120) as s:
        s.fake.min_cache_tokens = 10**9  # Google: "Cached content is too small"
        system = system_prompt(3)
        await s.chat(system)
        await s.wait_creates(1, status=400)
        await s.wait_stored(0, negative=1)
        for i in range(3):
            await s.chat(system, f"retry {i}")
        await asyncio.sleep(0.2)
        assert s.fake.count(Op.CREATE) == 1
        assert (await s.stats())["negative"] == 3
        # After the negative TTL the prefix is tried again.
        s.fake.min_cache_tokens = 1024
        s.clock.advance(121)
        await s.chat(system, "later")
        await s.wait_creates(1)
        assert s.fake.count(Op.CREATE) == 2


async def test_lru_eviction_sends_a_delete(stack: StackFactory) -> None:
    async with stack(max_entries=10) as s:
        names: list[str] = []
        for i in range(11):
            await s.chat(system_prompt(100 + i))
            await s.wait_creates(i + 1)
            names.append(list(s.fake.caches)[-1])
            if i < 10:
                # The service stamps an entry when it stores Google's answer, a moment after the
                # fake sent it: advancing the clock before that would give two entries one time.
                await s.wait_stored(i + 1)
            s.clock.advance(1)  # distinct last-use times: the LRU order is the creation order
        await wait_for(lambda: s.fake.count(Op.DELETE) == 1)
        assert s.fake.calls_for(Op.DELETE)[0].path.endswith(names[0])


async def test_extend_on_hit_sends_one_patch(stack: StackFactory) -> None:
    async with stack(extend_on_hit=True, ttl="60s") as s:
        system = system_prompt(4)
        await s.chat(system)
        await s.wait_creates(1)
        await s.wait_stored(1)
        s.clock.advance(50)  # 10 s of 60 left: within the last 20 %
        for i in range(3):
            assert _cached(await s.chat(system, f"hit {i}")) > 0
        await wait_for(lambda: s.fake.count(Op.PATCH) == 1)
        await asyncio.sleep(0.2)
        assert s.fake.count(Op.PATCH) == 1


async def test_a_service_restart_keeps_its_entries(stack: StackFactory) -> None:
    async with stack() as s:
        system = system_prompt(5)
        await s.chat(system)
        await s.wait_creates(1)
        await s.wait_stored(1)
        await s.stop_service()
        await s.start_service()  # a new process state: everything it knows comes from Redis
        cached = 0
        for i in range(3):  # the first lookup may meet nats-server's "no responders" quirk
            cached = _cached(await s.chat(system, f"after restart {i}"))
            if cached:
                break
        assert cached > 0
        assert s.fake.count(Op.CREATE) == 1


@pytest.mark.parametrize("native", [False, True], ids=["compat", "native"])
async def test_a_stale_reference_is_resent_without_the_cache(stack: StackFactory, native: bool) -> None:
    async with stack(prefer_native_api=native) as s:
        system = system_prompt(6)
        await s.chat(system)
        await s.wait_creates(1)
        await s.wait_stored(1)
        s.fake.caches.clear()  # expired or deleted at Google behind the router's back
        answer = await s.chat(system, "still there?")
        assert answer.choices[0].message.content == s.fake.reply_text
        rejected, resent = s.upstream_calls()[-2:]
        assert rejected.status == 403 and resent.status == 200
        if native:
            assert rejected.body["cachedContent"] and "systemInstruction" not in rejected.body
            assert "cachedContent" not in resent.body and resent.body["systemInstruction"]["parts"][0]["text"] == system
        else:
            assert _compat_ref(rejected) and _compat_ref(resent) is None
            assert resent.body["messages"][0] == {"role": "system", "content": system}
        # The entry was dropped: the next request is a miss that creates the cache again.
        await s.until(lambda stats: stats["stale"] == 1 and stats["entries"] == 0)
        await s.chat(system, "once more")
        await s.wait_creates(2)


async def test_the_local_memo_spares_lookups_and_ensures(stack: StackFactory) -> None:
    async with stack(lookup_memo_ms=60_000) as s:
        system = system_prompt(12)
        await s.chat(system)
        await s.wait_creates(1)
        await s.wait_stored(1)
        # Remembered as "create in flight": no lookup, no second ensure, served uncached.
        assert _cached(await s.chat(system, "again")) == 0
        stats = await s.stats()
        assert stats["lookups"] == {"hit": 0, "miss": 1, "negative": 0} and stats["ingress"]["memo_entries"] == 1
        cache = s.ingress.app.gemini.cache
        assert cache is not None
        cache.memo.clear()
        # One lookup finds the entry; the next request takes it from the memo.
        assert _cached(await s.chat(system, "third")) > 0 and _cached(await s.chat(system, "fourth")) > 0
        stats = await s.stats()
        assert stats["lookups"]["hit"] == 1 and stats["hit"] == 2 and stats["miss"] == 2
        assert s.fake.count(Op.CREATE) == 1
