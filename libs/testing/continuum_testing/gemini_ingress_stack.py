"""The whole Gemini path for tests: the official openai SDK -> the real ingress (loopback HTTP)
-> the fake Gemini API, with the real gemini-cache service on real NATS (and Redis), sharing a
fake clock with the fake Google so tests move time instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from continuum_common.config import RouterConfig
from continuum_gemini_cache.app import GeminiCacheApp
from continuum_testing.fake_gemini import FakeGemini, Op
from continuum_testing.gemini_cache import KEY_ENV, MODEL, FakeClock, wait_for
from continuum_testing.ingress_harness import RunningIngress, running_ingress

ADMIN_ENV = "CONTINUUM_TEST_GEMINI_ADMIN"
ADMIN_TOKEN = "admin-token-for-gemini-tests"


def stack_config(
    fake_url: str,
    nats_url: str,
    *,
    redis_url: str | None = None,
    enabled: bool = True,
    bus: dict[str, Any] | None = None,
    redis_options: dict[str, Any] | None = None,
    **cache: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "backends": [{"name": "gem-a", "url": fake_url, "type": "gemini", "models": [MODEL], "api_key_env": KEY_ENV}],
        "gemini_context_cache": {"enabled": enabled, "lookup_memo_ms": 0, **cache},
        "bus": {"embedded": False, "url": nats_url, **(bus or {})},
        "admin": {"token_env": ADMIN_ENV},
    }
    if redis_url is not None:
        data["redis"] = {"url": redis_url, **(redis_options or {})}
    return data


@dataclass
class GeminiStack:
    fake: FakeGemini
    clock: FakeClock
    config: dict[str, Any]
    ingress: RunningIngress
    client: openai.AsyncOpenAI
    service: GeminiCacheApp | None = None
    admin: httpx.AsyncClient = field(init=False)

    def __post_init__(self) -> None:
        self.admin = httpx.AsyncClient(
            base_url=f"{self.ingress.url}/admin", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}
        )

    async def start_service(self) -> GeminiCacheApp:
        self.service = GeminiCacheApp(RouterConfig.model_validate(self.config), clock=self.clock)
        await self.service.start()
        return self.service

    async def stop_service(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None

    async def chat(self, system: str, user: str = "Hello!", **kwargs: Any) -> Any:
        return await self.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            **kwargs,
        )

    def upstream_calls(self) -> list[Any]:
        return [c for c in self.fake.calls if c.op in (Op.OPENAI_CHAT, Op.GENERATE, Op.STREAM_GENERATE)]

    async def stats(self) -> dict[str, Any]:
        response = await self.admin.get("/gemini-context-cache/stats")
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    async def until(self, condition: Callable[[dict[str, Any]], bool], within: float = 5.0) -> dict[str, Any]:
        """Poll the admin stats until `condition` holds."""
        deadline = time.monotonic() + within
        while True:
            stats = await self.stats()
            if condition(stats):
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"stats never matched: {stats}")
            await asyncio.sleep(0.02)

    async def wait_creates(self, n: int, *, status: int | None = 200) -> None:
        await wait_for(lambda: self.fake.count(Op.CREATE, status=status) >= n)

    async def wait_stored(self, entries: int = 1, negative: int = 0) -> None:
        """Until the service has recorded what Google answered (the fake's answer is seen a
        moment before the service stores it)."""
        await self.until(lambda s: s["entries"] == entries and s["negative_entries"] == negative)


@contextlib.asynccontextmanager
async def gemini_stack(
    fake: FakeGemini,
    clock: FakeClock,
    nats_url: str,
    *,
    redis_url: str | None = None,
    with_service: bool = True,
    bus: dict[str, Any] | None = None,
    redis_options: dict[str, Any] | None = None,
    **cache: Any,
) -> AsyncIterator[GeminiStack]:
    config = stack_config(fake.url, nats_url, redis_url=redis_url, bus=bus, redis_options=redis_options, **cache)
    stack: GeminiStack | None = None
    # The service subscribes before the ingress connects (so its first lookups find it).
    service = None
    if with_service and config["gemini_context_cache"]["enabled"]:
        service = GeminiCacheApp(RouterConfig.model_validate(config), clock=clock)
        await service.start()
    try:
        async with running_ingress(config) as ingress:
            client = openai.AsyncOpenAI(base_url=f"{ingress.url}/v1", api_key="client-key", max_retries=0)
            stack = GeminiStack(fake, clock, config, ingress, client, service)
            try:
                yield stack
            finally:
                await client.close()
                await stack.admin.aclose()
    finally:
        if stack is not None:
            await stack.stop_service()
        elif service is not None:
            await service.stop()
