"""The fleet driver against several router replicas, and the engine-call tap, over real loopback
HTTP: sim engines stand in for replicas (each is an OpenAI-compatible base URL), and the tap
relays real streaming traffic."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from continuum_bench.compare import ROUTERS, compare, front, router, write_summary
from continuum_bench.fleet.harness import FleetContext
from continuum_bench.fleet.runner import FleetBenchOptions, report_and_print, run_fleet_bench
from continuum_bench.fleet.tap import EngineTap
from continuum_sim import SimFleet


async def test_requests_are_spread_over_replicas_round_robin(tmp_path: Path) -> None:
    """Three "replicas" (engines here, so each one's /metrics shows what it got): the driver
    takes them in turn per request, and the report counts requests per replica."""
    async with SimFleet(3, time_scale=0.01) as fleet:
        info = tmp_path / "fleet.json"
        fleet.write_info(info)
        opts = FleetBenchOptions(
            router=",".join(fleet.urls), router_label="three", workload="shared-prompt", time_scale=0.01,
            requests=12, rate=50, docs=2, doc_tokens=200, output_tokens=4, fleet_file=str(info),
            progress=False, plot=False, wait_for_router=5, out_dir=str(tmp_path),
        )  # fmt: skip
        report, results = await run_fleet_bench(opts)
    res = report["results"]
    assert res["ok"] == 12
    assert [r["requests"] for r in res["per_replica"]] == [4, 4, 4]
    assert [r["url"] for r in res["per_replica"]] == [u + "/v1" for u in fleet.urls]
    assert [e["requests"] for e in res["per_engine"]] == [4, 4, 4], "each replica really served its share"
    assert sorted(r.replica for r in results if r.replica is not None) == sorted([0, 1, 2] * 4)


async def test_one_unreachable_replica_fails_the_wait(tmp_path: Path) -> None:
    async with SimFleet(1, time_scale=0.01) as fleet:
        info = tmp_path / "fleet.json"
        fleet.write_info(info)
        opts = FleetBenchOptions(
            router=f"{fleet.urls[0]},http://127.0.0.1:9", workload="shared-prompt", requests=2, docs=1,
            doc_tokens=50, output_tokens=2, fleet_file=str(info), progress=False, plot=False, wait_for_router=1,
        )  # fmt: skip
        with pytest.raises(RuntimeError, match=r"127\.0\.0\.1:9/v1 did not answer"):
            await run_fleet_bench(opts)


async def test_tap_counts_calls_and_relays_streams_unchanged() -> None:
    async with SimFleet(2, time_scale=0.01) as fleet, EngineTap(fleet.endpoints) as tap:
        assert [e.name for e in tap.endpoints] == ["sim-0", "sim-1"]
        assert all(t.url != e.url for t, e in zip(tap.endpoints, fleet.endpoints, strict=True))
        body = {"model": "continuum-sim-8b", "prompt": "Tell me a story about routers.", "max_tokens": 8}
        async with httpx.AsyncClient(timeout=10) as client:
            direct = await client.post(fleet.urls[0] + "/v1/completions", json=body)
            tapped = await client.post(tap.endpoints[0].url + "/v1/completions", json=body)
            assert tapped.status_code == 200 and tapped.json()["choices"] == direct.json()["choices"]
            # Streaming through the tap, several requests on one keep-alive connection.
            for _ in range(3):
                async with client.stream(
                    "POST", tap.endpoints[1].url + "/v1/completions", json={**body, "stream": True}
                ) as resp:
                    lines = [line async for line in resp.aiter_lines() if line.startswith("data: ")]
                assert lines[-1] == "data: [DONE]" and len(lines) >= 3
            # A chunked request body (no Content-Length) is framed correctly too.
            chunks = [b'{"model": "continuum-sim-8b", ', b'"prompt": "Hi", "max_tokens": 2}']

            async def gen():  # type: ignore[no-untyped-def]
                for c in chunks:
                    yield c

            resp = await client.post(
                tap.endpoints[1].url + "/v1/completions?x=1",
                content=gen(),
                headers={"content-type": "application/json"},
            )
            assert resp.status_code == 200
            tokenize = await client.post(tap.endpoints[0].url + "/tokenize", json={"prompt": "hello world"})
            assert tokenize.json()["count"] >= 2
            assert (await client.get(tap.endpoints[0].url + "/health")).status_code == 200
        counts = tap.counts()
        assert counts == {
            "sim-0": {"POST /v1/completions": 1, "POST /tokenize": 1, "GET /health": 1},
            "sim-1": {"POST /v1/completions": 4},
        }
        assert tap.totals()["POST /v1/completions"] == 5 and tap.errors == 0
        tap.reset()
        assert tap.totals() == {}


async def test_tap_survives_garbage_and_keeps_serving() -> None:
    async with SimFleet(1, time_scale=0.01) as fleet, EngineTap(fleet.endpoints) as tap:
        port = int(tap.endpoints[0].url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"", "the tap closes a connection it cannot frame"
        writer.close()
        await writer.wait_closed()
        async with httpx.AsyncClient(timeout=5) as client:
            assert (await client.get(tap.endpoints[0].url + "/health")).status_code == 200
        assert tap.errors == 1 and tap.totals() == {"GET /health": 1}


async def test_compare_spreads_over_replicas_and_counts_engine_calls(tmp_path: Path) -> None:
    """A registered factory that yields two URLs (two "replicas" of a router — here the engines
    themselves, reached through the tap): compare runs it, the driver alternates, and the
    engine calls per request come out of the tap."""

    @contextlib.asynccontextmanager
    async def two(ctx: FleetContext) -> AsyncIterator[list[str]]:
        yield [ctx.endpoints[0].url, ctx.endpoints[1].url]

    router("test-two-replicas")(two)
    try:
        base = FleetBenchOptions(
            engines=2, requests=10, rate=40.0, docs=2, doc_tokens=200, output_tokens=4, time_scale=0.05,
            in_process=True, plot=False, progress=False, out_dir=str(tmp_path / "results"), command="test",
        )  # fmt: skip
        reports = await compare(
            ["test-two-replicas"], ["shared-prompt"], base, tmp_path / "work", count_engine_calls=True
        )
    finally:
        del ROUTERS["test-two-replicas"]
    (report,) = reports
    assert [r["requests"] for r in report["results"]["per_replica"]] == [5, 5]
    calls = report["engine_calls"]
    assert calls["routed_requests"] == 10
    assert calls["by_route"] == {"POST /v1/chat/completions": 10}, "the reset and scrapes bypass the tap"
    assert {name: c["POST /v1/chat/completions"] for name, c in calls["by_engine"].items()} == {"sim-0": 5, "sim-1": 5}
    write_summary(reports, [], base, tmp_path / "results", "summary")
    text = (tmp_path / "results" / "summary.md").read_text()
    engine, added = report["results"]["engine_ttft_s"]["mean"], report["results"]["engine_ttft_s"]["router_added_mean"]
    row = f"| shared-prompt | test-two-replicas | {engine * 1000:.2f} | "
    assert row in text and f"| {added * 1000:.2f} |" in text, "the summary shows what the router added"


async def test_restart_router_at_restarts_the_front_and_splits_the_report(tmp_path: Path) -> None:
    """`--restart-router-at`: a factory whose front is restartable (`front`) is stopped and
    started again mid-run; here each start is an engine (a stand-in router), so what each
    start served shows on the engines. The report splits the run at the restart."""
    starts: list[int] = []
    stopped: list[int] = []

    @contextlib.asynccontextmanager
    async def one_start(ctx: FleetContext) -> AsyncIterator[str]:
        n = len(starts)
        starts.append(n)
        try:
            yield ctx.endpoints[n % 2].url
        finally:
            stopped.append(n)

    @contextlib.asynccontextmanager
    async def restartable(ctx: FleetContext) -> AsyncIterator[str]:
        async with front(ctx, lambda: one_start(ctx)) as url:
            yield url

    @contextlib.asynccontextmanager
    async def fixed(ctx: FleetContext) -> AsyncIterator[str]:
        yield ctx.endpoints[0].url

    router("test-restartable")(restartable)
    router("test-fixed")(fixed)
    failures: list[dict[str, str]] = []
    try:
        base = FleetBenchOptions(
            engines=2, requests=40, rate=20.0, docs=2, doc_tokens=200, output_tokens=4, time_scale=1.0,
            in_process=True, plot=False, progress=False, out_dir=str(tmp_path / "results"), command="test",
            restart_router_at=1.0,
        )  # fmt: skip
        reports = await compare(
            ["test-restartable", "test-fixed"], ["shared-prompt"], base, tmp_path / "work", failures=failures
        )
    finally:
        del ROUTERS["test-restartable"], ROUTERS["test-fixed"]
    assert starts == [0, 1] and stopped == [0, 1], "started twice, each start stopped once"
    (report,) = reports
    restart = report["restart"]
    assert restart["at_s"] >= 1.0 and restart["downtime_s"] >= 0
    assert 0 <= restart["drain_s"] <= restart["downtime_s"] and restart["restart_s"] > 0
    assert restart["drain_s"] + restart["restart_s"] == pytest.approx(restart["downtime_s"], abs=0.002)
    before, after = restart["before"]["requests"], restart["after"]["requests"]
    assert before + after == 40 and before >= 10 and after >= 10
    served = [e["requests"] for e in report["results"]["per_engine"]]
    assert served == [before, after], "the first start served everything before the restart, the second after"
    assert restart["before"]["errors"] == restart["after"]["errors"] == 0
    # A router without a restartable front cannot claim a restart: its run fails and is reported.
    assert [f["router"] for f in failures] == ["test-fixed"]
    assert "cannot be restarted mid-run" in failures[0]["error"]
    write_summary(reports, failures, base, tmp_path / "results", "summary")
    text = (tmp_path / "results" / "summary.md").read_text()
    assert "Router restarted mid-run" in text and "| shared-prompt | test-restartable |" in text


async def test_a_router_that_does_not_come_back_fails_its_run_and_the_comparison_goes_on(tmp_path: Path) -> None:
    starts: list[int] = []

    @contextlib.asynccontextmanager
    async def first_only(ctx: FleetContext) -> AsyncIterator[str]:
        starts.append(len(starts))
        if len(starts) > 1:
            raise RuntimeError("the new process exited at once")
        yield ctx.endpoints[0].url

    @contextlib.asynccontextmanager
    async def fragile(ctx: FleetContext) -> AsyncIterator[str]:
        async with front(ctx, lambda: first_only(ctx)) as url:
            yield url

    router("test-fragile")(fragile)
    failures: list[dict[str, str]] = []
    try:
        base = FleetBenchOptions(
            engines=1, requests=20, rate=20.0, docs=1, doc_tokens=100, output_tokens=2, time_scale=1.0,
            in_process=True, plot=False, progress=False, out_dir=str(tmp_path / "results"), command="test",
            restart_router_at=0.5,
        )  # fmt: skip
        reports = await asyncio.wait_for(
            compare(["test-fragile"], ["shared-prompt"], base, tmp_path / "work", failures=failures), 60
        )
    finally:
        del ROUTERS["test-fragile"]
    assert reports == [] and starts == [0, 1]
    assert [f["router"] for f in failures] == ["test-fragile"]
    assert "the interruption at 0.5 s failed: the new process exited at once" in failures[0]["error"]


async def test_request_log_names_the_backend_the_ingress_chose(tmp_path: Path) -> None:
    """`request_log`: one line per request in send order, with the backend Continuum's ingress
    named in its answer header, which is the engine that really served it."""
    from continuum_testing.ingress_harness import running_ingress

    async with SimFleet(2, time_scale=0.01) as fleet:
        info = tmp_path / "fleet.json"
        fleet.write_info(info)
        config = {"backends": fleet.router_backends(), "selection_strategy": "PrefixAwareHash",
                  "prefix_routing": {"enabled": True}}  # fmt: skip
        async with running_ingress(config) as ing:
            opts = FleetBenchOptions(
                router=ing.url, router_label="ingress", workload="shared-prompt", time_scale=0.01, requests=10,
                rate=50, docs=3, doc_tokens=200, output_tokens=4, fleet_file=str(info), progress=False, plot=False,
                wait_for_router=5, out_dir=str(tmp_path), name="logged", request_log=True,
            )  # fmt: skip
            report, results = await run_fleet_bench(opts)
            report_and_print(report, results, opts)
    lines = [json.loads(line) for line in (tmp_path / "logged.requests.jsonl").read_text().splitlines()]
    assert len(lines) == 10 and all(line["ok"] for line in lines)
    assert [line["sent_at"] for line in lines] == sorted(line["sent_at"] for line in lines)
    names = [e.name for e in fleet.endpoints]
    served = {e["name"]: e["requests"] for e in report["results"]["per_engine"]}
    assert {name: sum(line["backend"] == name for line in lines) for name in names} == served
    assert all(set(line) >= {"prompt_tokens", "cached_tokens", "ideal_hit_tokens", "ttft"} for line in lines)
    assert not any(isinstance(v, str) and len(v) > 40 for line in lines for v in line.values()), "no text"
