"""Native Gemini streaming through the ingress with the context cache on: the official openai SDK
parses every converted chunk, and the usage chunk of a cached request reports cached_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from continuum_common.procs import NatsServer, RedisServer
from continuum_testing.fake_gemini import FakeGemini, Op
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, MODEL, FakeClock, system_prompt
from continuum_testing.gemini_ingress_stack import ADMIN_ENV, ADMIN_TOKEN, GeminiStack, gemini_stack


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    yield


@pytest_asyncio.fixture(loop_scope="session")
async def native(nats_server: NatsServer, redis_server: RedisServer) -> AsyncIterator[GeminiStack]:
    clock = FakeClock()
    async with FakeGemini(clock=clock, api_keys={API_KEY}) as fake:
        fake.reply_text = "Streaming works through the router, word by word."
        async with gemini_stack(
            fake, clock, nats_server.url, redis_url=redis_server.url, prefer_native_api=True
        ) as stack:
            yield stack


async def _stream(s: GeminiStack, system: str, **kwargs: Any) -> list[Any]:
    stream = await s.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Stream please."}],
        stream=True,
        **kwargs,
    )
    return [chunk async for chunk in stream]


async def test_native_stream_converts_to_openai_chunks_with_cached_tokens(native: GeminiStack) -> None:
    s = native
    system = system_prompt(7)
    chunks = await _stream(s, system, stream_options={"include_usage": True})
    call = s.upstream_calls()[-1]
    assert call.op is Op.STREAM_GENERATE and call.query == {"alt": "sse"}
    assert call.path == f"/v1beta/models/{MODEL}:streamGenerateContent"
    assert call.body["systemInstruction"]["parts"][0]["text"] == system
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == s.fake.reply_text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.prompt_tokens_details.cached_tokens == 0
    assert all(c.usage is None for c in chunks[:-1])

    await s.wait_creates(1)
    await s.wait_stored(1)
    (cache,) = s.fake.live_caches().values()
    chunks = await _stream(s, system, stream_options={"include_usage": True})
    call = s.upstream_calls()[-1]
    assert call.body["cachedContent"] == cache.name and "systemInstruction" not in call.body
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == s.fake.reply_text
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens == cache.token_count
    assert usage.prompt_tokens > cache.token_count
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    # Without include_usage the client gets no usage chunk; the cache still counts the tokens.
    chunks = await _stream(s, system)
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason == "stop"
    await s.until(lambda stats: stats["cached_tokens"] == 2 * cache.token_count and stats["hit"] == 2)


async def test_native_non_stream_hit_reports_cached_tokens(native: GeminiStack) -> None:
    s = native
    system = system_prompt(8)
    await s.chat(system)
    await s.wait_creates(1)
    await s.wait_stored(1)
    answer = await s.chat(system, "cached?", max_tokens=3)
    call = s.upstream_calls()[-1]
    assert call.op is Op.GENERATE and call.body["generationConfig"] == {"maxOutputTokens": 3}
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens_details.cached_tokens == s.fake.caches[call.body["cachedContent"]].token_count
