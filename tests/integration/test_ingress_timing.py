"""The ingress's own timing metrics over real HTTP: a streamed request's stages up to its first
chunk (the backend's wait lands in `backend`, not in the router's own stages) and the event
loop's lag, exported on /metrics."""

from __future__ import annotations

import asyncio

import httpx

from continuum_testing.ingress_harness import running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

STREAM = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
STAGES = "continuum_ingress_stream_stage_seconds"
LAG = "continuum_ingress_event_loop_lag_seconds"


async def samples(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    out = {}
    for line in text.splitlines():
        if line.startswith((STAGES, LAG)):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


async def test_a_streamed_request_is_timed_by_stage_and_the_loop_lag_is_exported() -> None:
    async with running_stubs("a") as stubs:
        stubs[0].stub.delay = 0.2  # the backend's time to its answer
        async with (
            running_ingress({"backends": stub_backends(stubs)}) as ing,
            httpx.AsyncClient(base_url=ing.url, timeout=10) as client,
        ):
            async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
                assert response.status_code == 200
                body = b"".join([chunk async for chunk in response.aiter_bytes()])
            assert b"[DONE]" in body
            got = await samples(client)
            for stage in ("read", "route", "backend", "to_client"):
                assert got[f'{STAGES}_count{{stage="{stage}"}}'] == 1
            backend = got[f'{STAGES}_sum{{stage="backend"}}']
            assert backend >= 0.2
            # the router's own stages are the rest of the way, not the backend's wait
            assert got[f'{STAGES}_sum{{stage="read"}}'] < backend
            assert got[f'{STAGES}_sum{{stage="route"}}'] < backend
            assert got[f'{STAGES}_sum{{stage="to_client"}}'] < backend
            for _ in range(100):  # a tick every 0.1 s
                if got.get(f"{LAG}_count", 0) > 0:
                    break
                await asyncio.sleep(0.05)
                got = await samples(client)
            assert got[f"{LAG}_count"] > 0 and got[f"{LAG}_sum"] >= 0
