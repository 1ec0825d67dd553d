"""continuum_common.exposition.render: generate_latest's bytes, produced a family at a time with
a turn of the event loop after each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from continuum_common.exposition import render
from continuum_testing.loop_turns import turns_during


def _registry(families: int = 40) -> CollectorRegistry:
    registry = CollectorRegistry()
    for i in range(families):
        counter = Counter(f"test_requests_{i}", "requests", ["backend", "outcome"], registry=registry)
        counter.labels("a", "ok").inc(i + 1)
        counter.labels("b", "error").inc(2 * i)
        Gauge(f"test_depth_{i}", "depth", registry=registry).set(i / 3)
        histogram = Histogram(f"test_latency_{i}", "latency", ["backend"], registry=registry)
        histogram.labels("a").observe(0.01 * i)
    return registry


class _SlowCollector:
    """A collector whose every family takes `seconds` of blocking work to produce."""

    def __init__(self, families: int, seconds: float) -> None:
        self.families = families
        self.seconds = seconds

    def collect(self) -> Iterator[Metric]:
        for i in range(self.families):
            time.sleep(self.seconds)
            family = GaugeMetricFamily(f"test_slow_{i}", "slow", labels=["n"])
            family.add_metric([str(i)], float(i))
            yield family


async def test_render_gives_generate_latests_bytes_in_the_same_order() -> None:
    registry = _registry()
    expected = generate_latest(registry)
    assert await render(registry) == expected


async def test_render_includes_custom_collectors_output() -> None:
    registry = _registry(families=2)
    registry.register(_SlowCollector(3, 0.0))
    body = await render(registry)
    assert body == generate_latest(registry)
    assert b'test_slow_2{n="2"} 2.0' in body


async def test_render_gives_the_loop_a_turn_after_each_family() -> None:
    registry = _registry()  # 120 families
    _, turns = await turns_during(render(registry))
    assert turns >= 119


async def test_slow_families_do_not_hold_the_loop_for_the_whole_scrape() -> None:
    registry = CollectorRegistry()
    registry.register(_SlowCollector(10, 0.003))  # 30 ms of collecting in all
    gaps: list[float] = []
    done = False

    async def prober() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(prober())
    await asyncio.sleep(0)
    body = await render(registry)
    done = True
    await task
    assert body.count(b"# TYPE test_slow_") == 10
    # The prober got the loop between families: gaps of one family's 3 ms, not the whole 30 ms.
    assert len(gaps) >= 9
    assert max(gaps) < 0.025
