"""Prometheus text exposition that shares the event loop with the requests a service serves.

`prometheus_client.generate_latest` collects and formats a whole registry in one call, which
holds the event loop for the whole exposition: 2-5 ms for a router with 32 backends on an idle
machine, 12-22 ms on a loaded one. A request needs several loop turns to pass through a router
(its head, its body, the upstream's answer), so one that arrives during a scrape waits for all
of it. `render` produces the same text one metric family at a time and gives the loop a turn
after each, so such a request waits for a family, not for the exposition.

Why a family per turn and not a time budget per turn: a request waits once per turn it needs,
so its delay is its turns times a slice's length. Slices of 0.2 or 1 ms (several families
collected, then formatted) kept most of the delay (docs/benchmarks.md, "A Prometheus scrape and
the requests beside it").

What stays the same: the bytes (each family is formatted by `generate_latest` itself, in the
registry's order), and what a scrape may see. Like `generate_latest`, it reads one family after
another, so samples of different families are not one snapshot; a family's own samples are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class Families(Collector):
    """Families already collected or parsed, as a collector (what `generate_latest` and `render`
    read)."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


async def render(registry: Collector) -> bytes:
    """The registry's exposition, as `generate_latest(registry)` gives it, with a turn of the
    event loop after each family."""
    parts: list[bytes] = []
    for family in registry.collect():  # collecting a family happens in its own turn too
        parts.append(generate_latest(Families((family,))))
        await asyncio.sleep(0)
    return b"".join(parts)
