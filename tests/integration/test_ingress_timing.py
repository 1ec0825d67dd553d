"""The ingress's own timing metrics over real HTTP: a streamed request's stages up to its first
chunk (the backend's wait lands in `backend`, not in the router's own stages) and the event
loop's lag, exported on /metrics; and `bench compare`'s scrape of them."""

from __future__ import annotations

import asyncio

import httpx

from continuum_bench.fleet.router_timing import scrape_timing
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


async def test_the_bench_scrapes_the_difference_a_run_made() -> None:
    async with running_stubs("a") as stubs:
        stubs[0].stub.delay = 0.1
        async with (
            running_ingress({"backends": stub_backends(stubs)}) as ing,
            httpx.AsyncClient(base_url=ing.url, timeout=10) as client,
        ):
            before = await scrape_timing([ing.url + "/v1"])  # the form the load generator is given
            assert before is not None and before.streams == 0
            for _ in range(2):
                async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
                    await response.aread()
            after = await scrape_timing([ing.url])
            assert after is not None
            run = after.minus(before)
            assert run.streams == 2
            backend = run.stage_mean("backend")
            assert backend is not None and backend >= 0.1
            # a server without the ingress's metrics (here the stub) is not timed
            assert await scrape_timing([ing.url, stubs[0].url]) is None
