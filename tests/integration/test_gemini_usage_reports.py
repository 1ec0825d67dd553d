"""Usage reports (the ingress's per-backend request outcomes, sent to the gemini-cache service
about once a second) are acknowledged; one sent while no service runs is counted as lost where
it is sent, and requests keep being served. The official openai SDK -> the real ingress ->
the fake Gemini API, with the real gemini-cache service on a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from continuum_common.procs import NatsServer
from continuum_testing.cache_support import metric
from continuum_testing.fake_gemini import FakeGemini
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, FakeClock, system_prompt
from continuum_testing.gemini_ingress_stack import ADMIN_ENV, ADMIN_TOKEN, GeminiStack, gemini_stack

LOST = "continuum_ingress_gemini_context_cache_usage_lost_requests_total"
DROPPED = "continuum_ingress_gemini_context_cache_dropped_total"
SENT = "continuum_ingress_gemini_context_cache_messages_total"


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    yield


@pytest_asyncio.fixture(loop_scope="session")
async def stack(nats_server: NatsServer) -> AsyncIterator[GeminiStack]:
    clock = FakeClock()
    async with FakeGemini(clock=clock, api_keys={API_KEY}) as fake, gemini_stack(fake, clock, nats_server.url) as s:
        yield s


async def _until_metric(url: str, name: str, at_least: float, within: float = 5.0, **labels: str) -> float:
    async with asyncio.timeout(within):
        while (value := await metric(url, name, **labels)) < at_least:
            await asyncio.sleep(0.05)
    return value


async def test_reports_sent_while_the_service_is_down_are_counted_as_lost(stack: GeminiStack) -> None:
    url = stack.ingress.url
    system = system_prompt(41)
    await stack.chat(system)
    # Acknowledged: the service's fleet-wide counts have it, nothing is lost.
    await stack.until(lambda stats: stats["miss"] + stats["hit"] + stats["negative"] >= 1)
    sent_before = await metric(url, SENT, kind="usage")
    assert sent_before >= 1
    assert await metric(url, LOST) == 0

    await stack.stop_service()
    for i in range(3):  # still served, straight from the backend
        answer = await stack.chat(system, f"while down {i}")
        assert answer.choices[0].message.content == stack.fake.reply_text
    assert await _until_metric(url, LOST, 3) == 3
    assert await metric(url, DROPPED, kind="usage", reason="no_responders") >= 1

    await stack.start_service()
    sent = await metric(url, SENT, kind="usage")
    await stack.chat(system, "back")
    await _until_metric(url, SENT, sent + 1, kind="usage")  # the report of "back" went out ...
    await stack.until(lambda stats: stats["miss"] + stats["hit"] + stats["negative"] >= 1)
    assert await metric(url, LOST) == 3  # ... and was acknowledged
