"""Test and benchmark helpers around the gemini-cache service: a controllable clock (the service
and FakeGemini both take a `clock`), a router config whose `type: gemini` backends point at the
fake, and a small bus client that speaks continuum_common.wire.gemini as the ingress does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import nats
import nats.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from continuum_common.config.router import RouterConfig
from continuum_common.wire.gemini import (
    ADMIN_TIMEOUT_S,
    ENSURE_REPLY_MARGIN_S,
    SUBJECT_ADMIN_CLEAR,
    SUBJECT_ADMIN_STATS,
    SUBJECT_DROP,
    SUBJECT_ENSURE,
    SUBJECT_LOOKUP,
    SUBJECT_USAGE,
    ClearReply,
    DropReply,
    DropRequest,
    EnsureReply,
    EnsureRequest,
    LookupReply,
    LookupRequest,
    UsageReport,
    digest_hex,
)

MODEL = "gemini-2.5-flash"
API_KEY = "goog-test-key-0123456789"
KEY_ENV = "CONTINUUM_TEST_GEMINI_KEY"


def system_prompt(i: int = 0, size: int = 20_000) -> str:
    """A system prompt over min_prefix_bytes (16 KiB) and over the fake's 1024-token minimum."""
    head = f"[prompt {i}] You are the support assistant of ACME. "
    return (head + "Follow the handbook below exactly. " * (size // 35 + 1))[:size]


class FakeClock:
    """The service and the fake share it, so tests move time instead of sleeping."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def router_config(
    fake_url: str,
    nats_url: str,
    *,
    redis_url: str | None = None,
    backends: tuple[str, ...] = ("gem-a",),
    **cache: Any,
) -> RouterConfig:
    data: dict[str, Any] = {
        "gemini_context_cache": {"enabled": True, **cache},
        "backends": [{"name": b, "url": fake_url, "type": "gemini", "api_key_env": KEY_ENV} for b in backends],
        "bus": {"embedded": False, "url": nats_url},
    }
    if redis_url is not None:
        data["redis"] = {"url": redis_url}
    return RouterConfig.model_validate(data)


async def wait_for(condition: Callable[[], bool], within: float = 15.0) -> None:
    # Generous: it returns as soon as the condition holds, and a busy 2-core CI machine can take
    # several seconds for what takes a fraction of one when it is quiet.
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class GeminiBusClient:
    """What the ingress does on the bus, reduced to calls."""

    def __init__(self, nc: NatsClient) -> None:
        self.nc = nc

    @classmethod
    async def connect(cls, url: str) -> GeminiBusClient:
        return cls(await nats.connect(url, connect_timeout=2))

    async def close(self) -> None:
        await self.nc.close()

    async def request(self, subject: str, data: bytes, timeout: float) -> Msg:
        # nats-server 2.15 occasionally (about 1 in 100 here) answers "no responders" to a
        # connection's first request when the responder subscribed (and flushed) after that
        # connection was opened. A long-lived ingress treats it as a miss; tests retry it.
        for _ in range(3):
            try:
                return await self.nc.request(subject, data, timeout=timeout)
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.02)
        return await self.nc.request(subject, data, timeout=timeout)

    async def lookup(self, system: str, *, backend: str = "gem-a", model: str = MODEL) -> LookupReply:
        req = LookupRequest(backend, model, digest_hex(model, system))
        msg = await self.request(SUBJECT_LOOKUP, req.to_bytes(), timeout=2)
        return LookupReply.from_bytes(msg.data)

    async def ensure(
        self, system: str, *, backend: str = "gem-a", model: str = MODEL, wait: float = 5.0
    ) -> EnsureReply:
        req = EnsureRequest.build(backend, model, system)
        msg = await self.request(SUBJECT_ENSURE, req.to_bytes(), timeout=wait + ENSURE_REPLY_MARGIN_S)
        return EnsureReply.from_bytes(msg.data)

    async def publish_ensure(self, system: str, *, backend: str = "gem-a", model: str = MODEL) -> None:
        await self.nc.publish(SUBJECT_ENSURE, EnsureRequest.build(backend, model, system).to_bytes())

    async def drop(self, system: str, name: str, *, backend: str = "gem-a", model: str = MODEL) -> DropReply:
        req = DropRequest(backend, digest_hex(model, system), name)
        msg = await self.request(SUBJECT_DROP, req.to_bytes(), timeout=2)
        return DropReply.from_bytes(msg.data)

    async def usage(self, report: UsageReport) -> None:
        """Send a report and wait for the service's acknowledgement."""
        await self.request(SUBJECT_USAGE, report.to_bytes(), timeout=2)

    async def stats(self) -> dict[str, Any]:
        msg = await self.request(SUBJECT_ADMIN_STATS, b"{}", timeout=ADMIN_TIMEOUT_S)
        result: dict[str, Any] = orjson.loads(msg.data)
        return result

    async def clear(self) -> ClearReply:
        msg = await self.request(SUBJECT_ADMIN_CLEAR, b"{}", timeout=ADMIN_TIMEOUT_S)
        return ClearReply.from_bytes(msg.data)
