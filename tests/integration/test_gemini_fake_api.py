"""The fake Gemini API server, validated with the official clients: google-genai (api_version
v1beta, base_url = the fake) must accept every body the fake returns, and the openai SDK must
accept the OpenAI-compatible endpoint's bodies and streams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import openai
import pytest
import pytest_asyncio
from google import genai
from google.genai import errors, types
from google.genai.client import AsyncClient

from continuum_testing.fake_gemini import FakeGemini, Op

KEY = "goog-test"
MODEL = "gemini-2.5-flash"
BIG = "You answer questions about the attached handbook. " * 120  # 1500 tokens in the fake


@pytest.fixture(autouse=True)
def _gemini_api_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_ENTERPRISE", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest_asyncio.fixture(loop_scope="session")
async def fake() -> AsyncIterator[FakeGemini]:
    async with FakeGemini(api_keys={KEY, "other-key"}) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def client(fake: FakeGemini) -> AsyncIterator[Callable[..., AsyncClient]]:
    """Makes SDK clients on the fake (one per API key) and closes them after the test."""
    made: dict[str, AsyncClient] = {}

    def make(key: str = KEY) -> AsyncClient:
        if key not in made:
            options = types.HttpOptions(base_url=fake.url, api_version="v1beta")
            made[key] = genai.Client(api_key=key, http_options=options).aio
        return made[key]

    yield make
    for sdk in made.values():
        await sdk.aclose()


async def test_sdk_cache_lifecycle(fake: FakeGemini, client: Callable[..., AsyncClient]) -> None:
    g = client()
    created = await g.caches.create(
        model=MODEL,
        config=types.CreateCachedContentConfig(system_instruction=BIG, ttl="300s", display_name="handbook"),
    )
    assert created.name and created.name.startswith("cachedContents/")
    assert created.model == "models/gemini-2.5-flash" and created.display_name == "handbook"
    assert created.usage_metadata is not None and created.usage_metadata.total_token_count == 1500
    assert created.expire_time is not None and created.create_time is not None
    assert (created.expire_time - created.create_time).total_seconds() == pytest.approx(300, abs=0.01)
    body = fake.calls_for(Op.CREATE)[0].body
    assert body["model"] == "models/gemini-2.5-flash" and body["ttl"] == "300s"
    assert body["systemInstruction"]["parts"][0]["text"] == BIG

    got = await g.caches.get(name=created.name)
    assert got.name == created.name and got.expire_time == created.expire_time

    updated = await g.caches.update(name=created.name, config=types.UpdateCachedContentConfig(ttl="7200s"))
    assert updated.expire_time is not None and updated.update_time is not None
    assert (updated.expire_time - updated.update_time).total_seconds() == pytest.approx(7200, abs=0.01)
    patch = fake.calls_for(Op.PATCH)[0]
    assert patch.body == {"ttl": "7200s"} and "updateMask" not in patch.query  # the SDK sends none

    second = await g.caches.create(model=MODEL, config=types.CreateCachedContentConfig(system_instruction=BIG + "2"))
    names = [c.name async for c in await g.caches.list(config=types.ListCachedContentsConfig(page_size=1))]
    assert names == [created.name, second.name]  # two pages of one
    assert fake.count(Op.LIST) == 2

    deleted = await g.caches.delete(name=created.name)
    assert deleted is not None
    assert fake.calls_for(Op.DELETE)[0].status == 200
    with pytest.raises(errors.ClientError) as info:
        await g.caches.get(name=created.name)
    assert info.value.code == 403 and info.value.status == "PERMISSION_DENIED"
    assert info.value.message == "CachedContent not found (or permission denied)"


async def test_sdk_sees_googles_errors(fake: FakeGemini, client: Callable[..., AsyncClient]) -> None:
    g = client()
    with pytest.raises(errors.ClientError) as info:
        await g.caches.create(model=MODEL, config=types.CreateCachedContentConfig(system_instruction="tiny", ttl="60s"))
    assert info.value.code == 400 and info.value.status == "INVALID_ARGUMENT"
    assert info.value.message == "Cached content is too small. total_token_count=1, min_total_token_count=1024"
    with pytest.raises(errors.ClientError) as info:
        await client("wrong").caches.list()
    assert info.value.code == 400 and "API key not valid" in (info.value.message or "")
    # A cache belongs to the key (project) that made it.
    mine = await g.caches.create(model=MODEL, config=types.CreateCachedContentConfig(system_instruction=BIG))
    with pytest.raises(errors.ClientError) as info:
        await client("other-key").caches.get(name=mine.name or "")
    assert info.value.code == 403
    empty = [c async for c in await client("other-key").caches.list()]
    assert empty == []
    fake.inject(Op.GET, 503)
    with pytest.raises(errors.ServerError) as server_info:
        await g.caches.get(name=mine.name or "")
    assert server_info.value.code == 503
    assert (await g.caches.get(name=mine.name or "")).name == mine.name  # one fault only


async def test_sdk_generate_with_and_without_cache(fake: FakeGemini, client: Callable[..., AsyncClient]) -> None:
    g = client()
    cache = await g.caches.create(model=MODEL, config=types.CreateCachedContentConfig(system_instruction=BIG))
    plain = await g.models.generate_content(model=MODEL, contents="hello there")
    assert plain.text == "This is a reply from the fake Gemini server."
    assert plain.usage_metadata is not None and plain.usage_metadata.cached_content_token_count is None
    assert plain.candidates and plain.candidates[0].finish_reason == types.FinishReason.STOP

    cached = await g.models.generate_content(
        model=MODEL, contents="hello there", config=types.GenerateContentConfig(cached_content=cache.name)
    )
    usage = cached.usage_metadata
    assert usage is not None and usage.cached_content_token_count == 1500
    assert usage.prompt_token_count == 1500 + 3  # promptTokenCount includes the cached tokens
    assert usage.total_token_count == (usage.prompt_token_count or 0) + (usage.candidates_token_count or 0)

    short = await g.models.generate_content(
        model=MODEL, contents="hi", config=types.GenerateContentConfig(max_output_tokens=3)
    )
    assert short.candidates and short.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS

    with pytest.raises(errors.ClientError) as info:  # cachedContent + systemInstruction is refused
        await g.models.generate_content(
            model=MODEL,
            contents="hi",
            config=types.GenerateContentConfig(cached_content=cache.name, system_instruction="again"),
        )
    assert info.value.code == 400 and "can not be used with" in (info.value.message or "")
    await g.caches.delete(name=cache.name or "")
    with pytest.raises(errors.ClientError) as info:  # a stale reference
        await g.models.generate_content(
            model=MODEL, contents="hi", config=types.GenerateContentConfig(cached_content=cache.name)
        )
    assert info.value.code == 403


async def test_sdk_stream_generate(fake: FakeGemini, client: Callable[..., AsyncClient]) -> None:
    g = client()
    cache = await g.caches.create(model=MODEL, config=types.CreateCachedContentConfig(system_instruction=BIG))
    chunks = [
        c
        async for c in await g.models.generate_content_stream(
            model=MODEL, contents="stream please", config=types.GenerateContentConfig(cached_content=cache.name)
        )
    ]
    assert len(chunks) > 2
    assert "".join(c.text or "" for c in chunks) == "This is a reply from the fake Gemini server."
    last = chunks[-1]
    assert last.candidates and last.candidates[0].finish_reason == types.FinishReason.STOP
    assert last.usage_metadata is not None and last.usage_metadata.cached_content_token_count == 1500
    assert all(c.candidates and c.candidates[0].finish_reason is None for c in chunks[:-1])
    call = fake.calls_for(Op.STREAM_GENERATE)[0]
    assert call.query.get("alt") == "sse" and call.body["cachedContent"] == cache.name


async def test_stream_frames_on_the_wire(fake: FakeGemini) -> None:
    async with httpx.AsyncClient(base_url=fake.url, timeout=5) as http:
        url = f"/v1/models/{MODEL}:streamGenerateContent"  # /v1 is served as well as /v1beta
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        sse = await http.post(url, params={"alt": "sse", "key": KEY}, json=body)
        assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")
        frames = sse.text.split("\r\n\r\n")
        assert frames[-1] == "" and all(f.startswith("data: {") for f in frames[:-1])
        assert "[DONE]" not in sse.text
        array = await http.post(url, params={"key": KEY}, json=body)
        assert array.status_code == 200 and isinstance(array.json(), list)
        assert len(array.json()) == len(frames) - 1
        missing = await http.post(url, json=body)
        assert missing.status_code == 403 and missing.json()["error"]["status"] == "PERMISSION_DENIED"
        unknown = await http.get("/v1beta/tunedModels", params={"key": KEY})
        assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"


async def test_openai_sdk_on_the_compat_endpoint(fake: FakeGemini, client: Callable[..., AsyncClient]) -> None:
    g = client()
    cache = await g.caches.create(model=MODEL, config=types.CreateCachedContentConfig(system_instruction=BIG))
    oc = openai.AsyncOpenAI(api_key=KEY, base_url=fake.openai_base_url, max_retries=0)
    plain = await oc.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": BIG}, {"role": "user", "content": "hi"}]
    )
    assert plain.choices[0].message.content == "This is a reply from the fake Gemini server."
    assert plain.choices[0].finish_reason == "stop"
    assert plain.usage is not None and plain.usage.prompt_tokens == 1501 and plain.usage.prompt_tokens_details is None

    cached = await oc.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"extra_body": {"google": {"cached_content": cache.name}}},
    )
    assert cached.usage is not None and cached.usage.prompt_tokens_details is not None
    assert cached.usage.prompt_tokens_details.cached_tokens == 1500 and cached.usage.prompt_tokens == 1501
    assert fake.calls_for(Op.OPENAI_CHAT)[-1].body["extra_body"] == {"google": {"cached_content": cache.name}}

    stream = await oc.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=3,
        extra_body={"extra_body": {"google": {"cached_content": cache.name}}},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens_details is not None
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 1500

    with pytest.raises(openai.BadRequestError):  # system prompt re-sent beside the cache
        await oc.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": BIG}, {"role": "user", "content": "hi"}],
            extra_body={"extra_body": {"google": {"cached_content": cache.name}}},
        )
    fake.inject(Op.OPENAI_CHAT, 429)
    with pytest.raises(openai.RateLimitError):
        await oc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    await oc.close()
