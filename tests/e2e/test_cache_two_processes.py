"""Two `continuum-router serve` processes share one Redis: an answer stored through the first is
a HIT on the second, which never calls a backend (seed Tier 3). Simulated engines in the test
process, the ingress processes talk to them and to a real redis-server over loopback."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from continuum_common.procs import RedisServer
from continuum_sim import SimFleet
from continuum_testing.cache_support import ADMIN_ENV, ADMIN_TOKEN, cache_config, engine_requests, wait_entries

MESSAGES: list[Any] = [
    {"role": "system", "content": "You answer questions about trains."},
    {"role": "user", "content": "How fast is a Shinkansen?"},
]


async def _serve(config: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_router", "serve", "--config", str(config), "--port", "0",
        "--watch-interval", "0",
        env={**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING", ADMIN_ENV: ADMIN_TOKEN},
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        line = (await proc.stdout.readline()).decode()
    match = re.search(r"listening on (http://\S+)", line)
    assert match, line
    return proc, match.group(1)


async def _stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        return await proc.wait()


async def _chat(url: str, model: str, *, stream: bool = False) -> tuple[str | None, str | None, bytes]:
    async with openai.AsyncOpenAI(api_key="sk-shared-tenant", base_url=f"{url}/v1", max_retries=0, timeout=10) as oc:
        if stream:
            async with oc.chat.completions.with_streaming_response.create(
                model=model, messages=MESSAGES, max_tokens=8, temperature=0, stream=True
            ) as r:
                data = b"".join([c async for c in r.iter_bytes()])
                return r.headers.get("x-cache"), r.headers.get("x-continuum-backend"), data
        raw = await oc.chat.completions.with_raw_response.create(
            model=model, messages=MESSAGES, max_tokens=8, temperature=0
        )
        raw.parse()
        return raw.headers.get("x-cache"), raw.headers.get("x-continuum-backend"), raw.content


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(2, time_scale=0.01) as running:
        yield running


async def test_second_process_answers_from_the_shared_redis(
    tmp_path: Path, redis_server: RedisServer, fleet: SimFleet
) -> None:
    config = tmp_path / "router.yaml"
    cfg = cache_config(fleet.router_backends(), backend="redis", redis={"url": redis_server.url})
    config.write_text(yaml.safe_dump(cfg))
    model = fleet.endpoints[0].model
    started = await asyncio.gather(_serve(config), _serve(config), return_exceptions=True)
    procs = [s[0] for s in started if isinstance(s, tuple)]
    try:
        for result in started:
            if isinstance(result, BaseException):
                raise result
        (_, first), (_, second) = started  # type: ignore[misc]
        before = engine_requests(fleet)
        miss = await _chat(first, model)
        assert miss[0] == "MISS" and miss[1] is not None
        await wait_entries(second, 1)
        hit = await _chat(second, model)
        assert hit == ("HIT", None, miss[2])
        # And the other way round for a stream.
        stream_miss = await _chat(second, model, stream=True)
        assert stream_miss[0] == "MISS"
        await wait_entries(first, 2)
        assert await _chat(first, model, stream=True) == ("HIT", None, stream_miss[2])
        assert engine_requests(fleet) == before + 2
    finally:
        codes = [await _stop(p) for p in procs]
    assert codes == [0, 0]
