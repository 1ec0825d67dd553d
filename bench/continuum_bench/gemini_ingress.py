"""What the ingress's Gemini support costs per request (`python -m continuum_bench.gemini_ingress`).

1. Conversions (pure, µs per call): OpenAI chat -> generateContent for a request with a 20 KB
   system prompt and 10 turns, the answer back, a 40-event native stream, compat usage reading.
2. End to end, sequential chat requests with a 20 KB system prompt (eligible for the context
   cache), p50/p99 ms: straight to the fake Gemini API's compat endpoint, then through the
   ingress with the cache off, on (hits answered from the local memo), on with
   `lookup_memo_ms: 0` (a NATS lookup per request), and on with the native API. nats-server and
   the gemini-cache service (memory state) are real; the fake API, the service and the ingress
   share this one process and event loop, so the differences are indicative. A hit also makes
   the upstream request 20 KB smaller, which the fake API (and Google) parse faster.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson

from continuum_common.config import RouterConfig
from continuum_common.procs import NatsServer
from continuum_common.wire.gemini import LookupReply, LookupResult, digest_hex
from continuum_gemini_cache.app import GeminiCacheApp
from continuum_ingress.gemini.memo import LookupMemo
from continuum_ingress.gemini.policy import Candidate, cache_candidate
from continuum_ingress.gemini.protocol.chat_completion import to_chat_completion
from continuum_ingress.gemini.protocol.compat import observe_body, with_cached_content
from continuum_ingress.gemini.protocol.request import to_generate_content
from continuum_ingress.gemini.protocol.stream import ChatStreamConverter
from continuum_testing.fake_gemini import FakeGemini
from continuum_testing.fake_gemini_bodies import Reply, Usage, generate_response, sse, stream_chunks
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, MODEL, system_prompt, wait_for
from continuum_testing.ingress_harness import running_ingress


def _micro(name: str, fn: Callable[[], object], n: int) -> None:
    for _ in range(min(n, 200)):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    print(f"  {name:44s} {(time.perf_counter() - start) / n * 1e6:8.1f} µs")


def conversions(n: int) -> None:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20} for i in range(10)]
    chat: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system_prompt(0)}, *turns],
        "temperature": 0.3,
    }
    reply = Reply(tuple(f" word{i}" for i in range(40)), False)
    usage = Usage(5000, 4000, 60)
    answer = generate_response(reply, usage, MODEL, "rid")
    stream = [sse(c) for c in stream_chunks(reply, usage, MODEL, "rid")]
    compat = orjson.dumps(
        {"choices": [], "usage": {"prompt_tokens": 5000, "prompt_tokens_details": {"cached_tokens": 4000}}}
    )

    def convert_stream() -> None:
        converter = ChatStreamConverter(model=MODEL, created=1, fallback_id="f", include_usage=True)
        for event in stream:
            converter.feed(event)
        converter.finish()

    memo = LookupMemo(60.0)
    hit = LookupReply(LookupResult.HIT, cached_content="cachedContents/x", expire_at=time.time() + 600)

    def decide_hit() -> None:
        # What the context cache does for an eligible request answered from the memo.
        found = cache_candidate(chat, 16_384, 1 << 20)
        assert isinstance(found, Candidate)
        key = ("gem-a", digest_hex(MODEL, found.system))
        memo.put(key, hit)
        reply = memo.get(key)
        assert reply is not None and reply.cached_content is not None
        orjson.dumps(with_cached_content(chat, reply.cached_content))

    print("conversions (one process, pure Python):")
    _micro("context-cache decision, memo hit (20 KB system)", decide_hit, n)
    _micro("chat -> generateContent (20 KB system, 10 turns)", lambda: orjson.dumps(to_generate_content(chat)), n)
    _micro(
        "generateContent answer -> chat completion",
        lambda: to_chat_completion(answer, model=MODEL, created=1, fallback_id="f"),
        n,
    )
    _micro("40-event native stream -> OpenAI chunks", convert_stream, max(n // 10, 10))
    _micro("compat usage read (cached_tokens)", lambda: observe_body(compat, None), n)


@contextlib.asynccontextmanager
async def _ingress(fake: FakeGemini, nats: str, **cache: Any) -> AsyncIterator[str]:
    config = {
        "backends": [{"name": "gem-a", "url": fake.url, "type": "gemini", "models": [MODEL], "api_key_env": KEY_ENV}],
        "gemini_context_cache": cache,
        "bus": {"embedded": False, "url": nats},
    }
    service = GeminiCacheApp(RouterConfig.model_validate(config)) if cache.get("enabled") else None
    if service is not None:
        await service.start()
    try:
        async with running_ingress(config) as ingress:
            yield f"{ingress.url}/v1/chat/completions"
    finally:
        if service is not None:
            await service.stop()


async def _timed(http: httpx.AsyncClient, url: str, body: dict[str, Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        response = await http.post(url, json=body, headers={"authorization": f"Bearer {API_KEY}"})
        samples.append((time.perf_counter() - start) * 1000)
        response.raise_for_status()
    return samples


def _line(name: str, samples: list[float], base: float | None) -> float:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    added = f"  vs cache off {p50 - base:+.2f} ms" if base is not None else ""
    print(f"  {name:40s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms{added}")
    return p50


async def end_to_end(n: int) -> None:
    os.environ[KEY_ENV] = API_KEY
    nats = NatsServer()
    await nats.start()
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system_prompt(1)}, {"role": "user", "content": "hi"}],
    }
    modes: list[tuple[str, dict[str, Any]]] = [
        ("ingress, cache off (compat)", {"enabled": False}),
        ("ingress, cache on, memo hits (compat)", {"enabled": True}),
        ("ingress, cache on, lookup per request", {"enabled": True, "lookup_memo_ms": 0}),
        ("ingress, cache on, native API", {"enabled": True, "prefer_native_api": True}),
    ]
    try:
        async with FakeGemini(api_keys={API_KEY}) as fake, httpx.AsyncClient(timeout=10) as http:
            print(f"end to end, {n} sequential requests each (20 KB system prompt):")
            direct = f"{fake.openai_base_url}chat/completions"
            await _timed(http, direct, body, 30)
            _line("direct to the fake compat endpoint", await _timed(http, direct, body, n), None)
            base: float | None = None
            for name, cache in modes:
                async with _ingress(fake, nats.url, **cache) as url:
                    await _timed(http, url, body, 1)
                    if cache["enabled"]:
                        await wait_for(lambda: bool(fake.live_caches()))
                    await _timed(http, url, body, 30)
                    p50 = _line(name, await _timed(http, url, body, n), base)
                    base = p50 if base is None else base
                fake.caches.clear()
    finally:
        await nats.close()


async def main(args: argparse.Namespace) -> None:
    conversions(args.micro)
    await end_to_end(args.requests)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--micro", type=int, default=2000)
    parsed = parser.parse_args()
    import uvloop

    uvloop.run(main(parsed))
