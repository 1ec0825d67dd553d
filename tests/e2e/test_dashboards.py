"""Every Grafana panel's query returns data from a real Prometheus scraping a real stack (the
services as processes, bench/continuum_bench/procstack.py) after traffic: no panel stays empty for lack of a
metric, a label or a name that changed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import urlsplit

from continuum_bench.procstack import Load, ProcessStack, StackOptions
from continuum_testing.prometheus_server import PrometheusServer

DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "grafana" / "dashboards"


def panel_queries() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text()).get("panels", []):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((f"{path.stem}: {panel.get('title')}", target["expr"]))
    return out


def host_port(url: str) -> str:
    return urlsplit(url).netloc


async def test_every_panel_query_returns_series(tmp_path: Path) -> None:
    queries = panel_queries()
    assert len(queries) >= 10
    async with ProcessStack(tmp_path / "stack", StackOptions()) as stack:
        assert stack.listener is not None
        jobs = {
            "ingress": [host_port(stack.url)],
            "indexer": [host_port(i.health_url) for i in stack.indexers],
            "kv-listener": [host_port(stack.listener.health_url)],
            "engines": [host_port(e.url) for e in stack.endpoints],
        }
        prometheus = PrometheusServer(tmp_path / "prometheus", jobs)
        await prometheus.start()
        try:
            async with Load(stack.url, rate=20) as load:
                await asyncio.sleep(12)
            assert load.report.lost == 0
            targets = await prometheus.targets()
            assert {t["health"] for t in targets} == {"up"}, [(t["scrapeUrl"], t["lastError"]) for t in targets]
            assert len(targets) == sum(len(v) for v in jobs.values())
            empty = [title for title, expr in queries if not await prometheus.query(expr)]
        finally:
            await prometheus.close()
    assert empty == [], f"panels without data: {empty}"
