"""gemini-cache operations: refusing to start when disabled, bad bus input, secrets kept out of
logs, /metrics and /healthz, and a Redis outage."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import yaml

from continuum_common.config.router import RouterConfig
from continuum_common.procs import NatsServer, RedisServer
from continuum_common.wire.gemini import SUBJECT_ENSURE, SUBJECT_LOOKUP, EnsureOutcome, LookupResult
from continuum_gemini_cache.app import GeminiCacheApp
from continuum_gemini_cache.errors import DisabledError
from continuum_testing.fake_gemini import FakeGemini, Op
from continuum_testing.gemini_cache import (
    API_KEY,
    KEY_ENV,
    GeminiBusClient,
    router_config,
    system_prompt,
)

LAG = "continuum_gemini_context_cache_event_loop_lag_seconds"


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    yield


@pytest_asyncio.fixture(loop_scope="session")
async def fake() -> AsyncIterator[FakeGemini]:
    async with FakeGemini(api_keys={API_KEY}) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def bus(nats_server: NatsServer) -> AsyncIterator[GeminiBusClient]:
    client = await GeminiBusClient.connect(nats_server.url)
    yield client
    await client.close()


def test_disabled_service_refuses_to_start(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({"gemini_context_cache": {"enabled": False}}))
    with pytest.raises(DisabledError):
        GeminiCacheApp(RouterConfig.model_validate({}))
    proc = subprocess.run(
        [sys.executable, "-m", "continuum_gemini_cache", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "gemini_context_cache.enabled is false" in proc.stderr and str(config) in proc.stderr


async def test_bad_messages_are_counted_and_dropped(
    fake: FakeGemini, nats_server: NatsServer, bus: GeminiBusClient
) -> None:
    app = GeminiCacheApp(router_config(fake.url, nats_server.url), state="memory")
    await app.start()
    try:
        reply = await bus.request(SUBJECT_LOOKUP, b"{not json", timeout=2)
        assert b'"miss"' in reply.data  # a waiting sender still gets an answer
        await bus.nc.publish(SUBJECT_ENSURE, b'{"backend": "gem-a"}')
        await bus.nc.publish(SUBJECT_ENSURE, b"\xff\xfe")
        await bus.nc.flush()
        await asyncio.sleep(0.1)
        dropped = app.metrics.registry.get_sample_value(
            "continuum_gemini_context_cache_dropped_total", {"reason": "bad_message"}
        )
        assert dropped == 3
        # Ineligible ensures are answered, not created: a vLLM-style backend name, a short prompt.
        assert (await bus.ensure(system_prompt(), backend="nope")).outcome is EnsureOutcome.INELIGIBLE
        assert (await bus.ensure("short system prompt")).outcome is EnsureOutcome.INELIGIBLE
        assert fake.count(Op.CREATE) == 0
        assert (await bus.ensure(system_prompt())).outcome is EnsureOutcome.CREATED  # still serving
    finally:
        await app.stop()


async def test_api_key_is_sent_but_never_logged(
    fake: FakeGemini, nats_server: NatsServer, bus: GeminiBusClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = GeminiCacheApp(router_config(fake.url, nats_server.url), state="memory")
    await app.start()
    try:
        fake.inject(Op.CREATE, 500)
        assert (await bus.ensure(system_prompt(1))).outcome is EnsureOutcome.FAILED
        fake.inject(Op.CREATE, 400, body={"error": {"code": 400, "message": "API key not valid.", "details": [
            {"reason": "API_KEY_INVALID"}]}})  # fmt: skip
        failed = await bus.ensure(system_prompt(1))
        assert failed.outcome is EnsureOutcome.FAILED and failed.error == "auth"  # not a negative entry
        assert (await bus.ensure(system_prompt(1))).outcome is EnsureOutcome.CREATED
    finally:
        await app.stop()
    assert {c.api_key for c in fake.calls_for(Op.CREATE)} == {API_KEY}
    assert caplog.records, "the failures above are logged"
    assert API_KEY not in caplog.text
    assert "Follow the handbook" not in caplog.text  # nor the prompt


async def test_metrics_and_health_endpoints(fake: FakeGemini, nats_server: NatsServer, bus: GeminiBusClient) -> None:
    app = GeminiCacheApp(router_config(fake.url, nats_server.url), state="memory", http_port=0)
    await app.start()
    try:
        await bus.ensure(system_prompt(2))
        await bus.lookup(system_prompt(2))
        assert app.http_url is not None
        async with httpx.AsyncClient(base_url=app.http_url, timeout=5) as http:
            text = (await http.get("/metrics")).text
            for _ in range(40):  # the loop-lag timer ticks every 0.1 s
                if f"{LAG}_count 0.0" not in text:
                    break
                await asyncio.sleep(0.05)
                text = (await http.get("/metrics")).text
            health = await http.get("/healthz")
        assert 'continuum_gemini_context_cache_creates_total{backend="gem-a"} 1.0' in text
        assert 'continuum_gemini_context_cache_lookups_total{backend="gem-a",result="hit"} 1.0' in text
        assert 'continuum_gemini_context_cache_requests_total{backend="gem-a",result="ineligible"} 0.0' in text
        assert f"{LAG}_count" in text and f"{LAG}_count 0.0" not in text
        assert health.status_code == 200 and health.json() == {"status": "ok", "nats": True, "state_store": True}
    finally:
        await app.stop()


async def test_redis_outage_answers_miss_and_recovers(
    fake: FakeGemini, nats_server: NatsServer, fresh_redis_server: RedisServer, bus: GeminiBusClient
) -> None:
    cfg = router_config(fake.url, nats_server.url, redis_url=fresh_redis_server.url)
    app = GeminiCacheApp(cfg, http_port=0)
    await app.start()
    try:
        created = await bus.ensure(system_prompt(3))
        assert created.outcome is EnsureOutcome.CREATED
        await fresh_redis_server.kill()
        assert (await bus.lookup(system_prompt(3))).result is LookupResult.MISS
        assert (await bus.ensure(system_prompt(4))).outcome is EnsureOutcome.FAILED
        async with httpx.AsyncClient(base_url=app.http_url or "", timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 503
        await fresh_redis_server.start()  # in-memory Redis without persistence comes back empty
        await asyncio.sleep(0.1)
        assert (await bus.ensure(system_prompt(3))).outcome is EnsureOutcome.CREATED
        assert (await bus.lookup(system_prompt(3))).result is LookupResult.HIT
    finally:
        await app.stop()
