"""The semantic cache against a real HTTP embedding server on loopback.

The server computes deterministic bag-of-words vectors (stop words dropped, each word hashed to
one of 256 dimensions), so a paraphrase using the same content words embeds to the same
direction and an unrelated question to an orthogonal one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig, parse
from continuum_common.procs import RedisServer, free_port
from continuum_ingress.cache import CacheRequest, CacheStatus, ResponseCache, Route, build_response_cache

DIM = 256
STOP = {"what", "whats", "is", "the", "of", "tell", "me", "please", "a", "s", "do", "you", "know", "i", "how"}
JSON = {"content-type": "application/json"}
KEY_A = {"authorization": "Bearer sk-a"}
KEY_B = {"authorization": "Bearer sk-b"}


def bag_of_words(text: str) -> list[float]:
    vec = np.zeros(DIM, dtype=np.float32)
    for word in re.findall(r"[a-z]+", text.lower().replace("'", "")):
        if word not in STOP:
            vec[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little") % DIM] += 1.0
    return vec.tolist()


@dataclass
class EmbeddingServer:
    port: int = 0
    mode: str = "float"  # float | base64 | slow | error
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:  # HTTP/1.1 keep-alive: one request after another on this connection
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                payload = orjson.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
                self.requests.append({"method": method, "path": path, "body": payload, "headers": headers})
                status, answer = 200, b""
                vector = bag_of_words(payload["input"])
                if self.mode == "slow":
                    # Answer after 1 s, or give up as soon as the client hangs up.
                    with contextlib.suppress(TimeoutError):
                        if not await asyncio.wait_for(reader.read(1), 1.0):
                            break
                if self.mode == "error":
                    status, answer = 500, b'{"error":{"message":"boom"}}'
                else:
                    emb: Any = vector
                    if self.mode == "base64":
                        emb = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
                    answer = orjson.dumps(
                        {
                            "object": "list",
                            "data": [{"object": "embedding", "index": 0, "embedding": emb}],
                            "model": payload["model"],
                            "usage": {"prompt_tokens": 3, "total_tokens": 3},
                        }
                    )
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(answer)}\r\n\r\n".encode()
                    + answer
                )
                await writer.drain()
        writer.close()


@pytest_asyncio.fixture(loop_scope="session")
async def embedder() -> AsyncIterator[EmbeddingServer]:
    srv = EmbeddingServer(port=free_port())
    server = await asyncio.start_server(srv.handle, "127.0.0.1", srv.port)
    yield srv
    server.close()
    await server.wait_closed()


def config(
    embedder_url: str, *, semantic: dict[str, Any] | None = None, top: dict[str, Any] | None = None, **extra: Any
) -> RouterConfig:
    return parse(
        RouterConfig,
        {
            "backends": [{"name": "embedder", "url": embedder_url, "internal": True, "api_key_env": "EMB_KEY"}],
            "response_cache": {
                "enabled": True,
                "semantic": {
                    "enabled": True,
                    "backend": "embedder",
                    "embedding_model": "bow-256",
                    "threshold": 0.95,
                    "embedding_timeout_ms": 300,
                    **(semantic or {}),
                },
                **extra,
            },
            **(top or {}),
        },
    )


def ask(
    question: str, system: str = "You are a geography tutor.", headers: dict[str, str] = KEY_A, **extra: Any
) -> CacheRequest:
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0,
        **extra,
    }
    return CacheRequest(Route.CHAT, body, headers)


ANSWER = orjson.dumps({"object": "chat.completion", "choices": [{"message": {"content": "Paris."}}]})


async def seed(cache: ResponseCache, request: CacheRequest) -> None:
    miss = await cache.lookup(request)
    assert miss.status is CacheStatus.MISS and miss.semantic is not None
    assert await cache.store(miss, status=200, headers=JSON, body=ANSWER)


@pytest.fixture(autouse=True)
def _emb_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMB_KEY", "emb-secret")


async def test_paraphrase_hits_within_the_partition(embedder: EmbeddingServer) -> None:
    registry = CollectorRegistry()
    async with build_response_cache(config(embedder.url), registry=registry) as cache:
        await seed(cache, ask("What is the capital of France?"))
        first = embedder.requests[-1]
        assert first["method"] == "POST" and first["path"] == "/v1/embeddings"
        assert first["body"] == {
            "model": "bow-256",
            "input": "What is the capital of France?",
            "encoding_format": "float",
        }
        assert first["headers"]["authorization"] == "Bearer emb-secret"

        hit = await cache.lookup(ask("Tell me, what's the capital of France"))
        assert hit.status is CacheStatus.HIT
        assert hit.headers == {"X-Cache": "HIT", "X-Cache-Mode": "semantic"}
        assert hit.response is not None and hit.response.body == ANSWER and not hit.response.is_stream

        assert (await cache.lookup(ask("How do I bake bread?"))).status is CacheStatus.MISS
        stats = await cache.stats()
        assert stats["semantic"]["hits"] == 1 and stats["semantic"]["entries"] == 1
        assert stats["requests"]["hit"] == 1
        # The body lives in the same store as exact entries (shares capacity): exact + sem:.
        assert stats["entries"] == 2


@pytest.mark.parametrize(
    "other",
    [
        ask("Tell me, what's the capital of France", headers=KEY_B),  # another API key
        ask("Tell me, what's the capital of France", headers={}),  # anonymous
        ask("Tell me, what's the capital of France", system="You are a pirate."),  # another system prompt
        ask("Tell me, what's the capital of France", tools=[{"type": "function", "function": {"name": "f"}}]),
        ask("Tell me, what's the capital of France", response_format={"type": "json_object"}),
        ask("Tell me, what's the capital of France", seed=3),
    ],
)
async def test_never_across_partitions(embedder: EmbeddingServer, other: CacheRequest) -> None:
    async with build_response_cache(config(embedder.url), registry=CollectorRegistry()) as cache:
        await seed(cache, ask("What is the capital of France?"))
        looked = await cache.lookup(other)
        assert looked.status is CacheStatus.MISS and looked.semantic is not None


async def test_base64_embeddings_are_understood(embedder: EmbeddingServer) -> None:
    embedder.mode = "base64"
    try:
        async with build_response_cache(config(embedder.url), registry=CollectorRegistry()) as cache:
            await seed(cache, ask("What is the capital of France?"))
            assert (await cache.lookup(ask("capital of France"))).status is CacheStatus.HIT
    finally:
        embedder.mode = "float"


@pytest.mark.parametrize(("mode", "reason"), [("slow", "timeout"), ("error", "error")])
async def test_embedding_failure_is_a_plain_miss(embedder: EmbeddingServer, mode: str, reason: str) -> None:
    registry = CollectorRegistry()
    async with build_response_cache(config(embedder.url), registry=registry) as cache:
        embedder.mode = mode
        try:
            started = time.monotonic()
            looked = await cache.lookup(ask("What is the capital of France?"))
            assert time.monotonic() - started < 0.9  # bounded by embedding_timeout_ms, not the server
            assert looked.status is CacheStatus.MISS and looked.semantic is None
            assert await cache.store(looked, status=200, headers=JSON, body=ANSWER)  # exact path still works
        finally:
            embedder.mode = "float"
        value = registry.get_sample_value("continuum_semantic_cache_embedding_failures_total", {"reason": reason})
        assert value == 1
        assert (await cache.lookup(ask("What is the capital of France?"))).status is CacheStatus.HIT


async def test_embedding_backend_down_is_a_plain_miss() -> None:
    registry = CollectorRegistry()
    async with build_response_cache(config(f"http://127.0.0.1:{free_port()}"), registry=registry) as cache:
        looked = await cache.lookup(ask("What is the capital of France?"))
        assert looked.status is CacheStatus.MISS and looked.semantic is None
        assert registry.get_sample_value("continuum_semantic_cache_embedding_failures_total", {"reason": "error"}) == 1


async def test_ineligible_requests_are_never_embedded(embedder: EmbeddingServer) -> None:
    async with build_response_cache(config(embedder.url), registry=CollectorRegistry()) as cache:
        before = len(embedder.requests)
        await cache.lookup(ask("What is the capital of France?", stream=True))
        await cache.lookup(ask("What is the capital of France?", temperature=0.5))
        await cache.lookup(ask("x" * 9000))  # over max_input_bytes
        await cache.lookup(CacheRequest(Route.COMPLETIONS, {"model": "m", "prompt": "capital of France"}, KEY_A))
        assert len(embedder.requests) == before


async def test_reload_turns_semantic_off_and_on(embedder: EmbeddingServer) -> None:
    async with build_response_cache(config(embedder.url), registry=CollectorRegistry()) as cache:
        await seed(cache, ask("What is the capital of France?"))
        layer = cache.semantic
        off = parse(RouterConfig, {"response_cache": {"enabled": True}})
        cache.reload(off)
        assert cache.semantic is None
        assert (await cache.lookup(ask("capital of France"))).status is CacheStatus.MISS
        cache.reload(config(embedder.url))
        assert cache.semantic is not None and cache.semantic is not layer
        same = cache.semantic
        cache.reload(config(embedder.url, semantic={"threshold": 0.5, "max_entries": 7}))
        assert cache.semantic is same  # same embedder: kept (with its vectors) and reconfigured
        assert same.settings.threshold == 0.5 and same.index.max_entries == 7
        cache.reload(config(embedder.url, semantic={"embedding_model": "other"}))
        assert cache.semantic is not same and cache.semantic is not None
        assert cache.semantic.embedder.model == "other"


async def test_semantic_bodies_go_to_the_sem_key_space_in_redis(
    embedder: EmbeddingServer, redis_server: RedisServer
) -> None:
    cfg = config(embedder.url, backend="redis", ttl="10m", top={"redis": {"url": redis_server.url}})
    raw = aioredis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        async with build_response_cache(cfg, registry=CollectorRegistry()) as cache:
            await seed(cache, ask("What is the capital of France?"))
            sem_keys = await raw.keys("cr:resp:sem:*")
            assert len(sem_keys) == 1 and len(sem_keys[0]) == len("cr:resp:sem:") + 64
            assert 590 <= await raw.ttl(sem_keys[0]) <= 600  # semantic.ttl unset: response_cache.ttl
            assert (await cache.lookup(ask("capital of France?"))).headers["X-Cache-Mode"] == "semantic"
            await raw.delete(sem_keys[0])  # body gone (evicted elsewhere): a miss, and the vector is dropped
            assert (await cache.lookup(ask("capital of France?"))).status is CacheStatus.MISS
            assert cache.semantic is not None and len(cache.semantic.index) == 0
    finally:
        await raw.aclose()


async def test_a_recorded_whole_answer_is_indexed_too(embedder: EmbeddingServer) -> None:
    async with build_response_cache(config(embedder.url), registry=CollectorRegistry()) as cache:
        miss = await cache.lookup(ask("What is the capital of France?"))
        rec = cache.recorder(miss)
        assert rec is not None
        rec.feed(ANSWER[:10])
        rec.feed(ANSWER[10:])
        assert await rec.commit(200, JSON)
        hit = await cache.lookup(ask("capital of France, please"))
        assert hit.headers.get("X-Cache-Mode") == "semantic"
        assert hit.response is not None and hit.response.body == ANSWER
