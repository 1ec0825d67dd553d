"""`continuum-router up` with `gemini_context_cache.enabled`: the embedded nats-server, the
gemini-cache service (memory state) and the ingress in one process, the fake Gemini API behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

from continuum_common.config import load_router_config
from continuum_router.up import SERVICES, UpContext, up
from continuum_testing.fake_gemini import FakeGemini, Op
from continuum_testing.gemini_cache import API_KEY, KEY_ENV, MODEL, system_prompt, wait_for


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    yield


def _write(path: Path, fake_url: str, enabled: bool) -> Path:
    data = {
        "server": {"port": 0},
        "backends": [{"name": "gem-a", "url": fake_url, "type": "gemini", "models": [MODEL], "api_key_env": KEY_ENV}],
        "gemini_context_cache": {"enabled": enabled, "lookup_memo_ms": 0},
        "bus": {"data_dir": str(path.parent / "nats")},
    }
    path.write_text(yaml.safe_dump(data))
    return path


async def test_up_runs_the_gemini_cache_service_when_enabled(tmp_path: Path) -> None:
    async with FakeGemini(api_keys={API_KEY}) as fake:
        path = _write(tmp_path / "router.yaml", fake.url, enabled=True)
        stop = asyncio.Event()
        ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(up(str(path), stop=stop, on_ready=ready.set_result, state_dir=tmp_path / "state"))
        try:
            url = await asyncio.wait_for(asyncio.shield(ready), 30)
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
            messages = [{"role": "system", "content": system_prompt(11)}, {"role": "user", "content": "hi"}]
            await client.chat.completions.create(model=MODEL, messages=messages)
            await wait_for(lambda: fake.count(Op.CREATE, status=200) == 1)
            cached = 0
            for _ in range(40):  # the service stores the new entry a moment after Google's answer
                again = await client.chat.completions.create(model=MODEL, messages=messages)
                assert again.usage is not None and again.usage.prompt_tokens_details is not None
                cached = again.usage.prompt_tokens_details.cached_tokens or 0
                if cached:
                    break
                await asyncio.sleep(0.05)
            await client.close()
            assert cached > 0 and fake.count(Op.CREATE) == 1
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


async def test_up_starts_gemini_cache_only_when_enabled(tmp_path: Path) -> None:
    path = _write(tmp_path / "off.yaml", "http://127.0.0.1:9", enabled=False)
    ctx = UpContext(path, load_router_config(path), "nats://127.0.0.1:9", tmp_path)
    (service,) = [s for s in SERVICES if s.name == "gemini-cache"]
    async with service.run(ctx) as description:  # nothing starts: no bus connection is tried
        assert description is None
    assert [s.name for s in SERVICES].index("gemini-cache") < [s.name for s in SERVICES].index("ingress")
