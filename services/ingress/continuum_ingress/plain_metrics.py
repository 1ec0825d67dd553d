"""A counter and a histogram for the request path, kept as plain numbers and turned into
Prometheus samples only when scraped.

prometheus_client's Counter and Histogram take a lock on every increment and look their child up
by label tuple; an ingress process runs one event loop and records five of them per request,
which was about a twentieth of its time per request (`continuum_bench.ingress_latency`). These
keep the same names, types and exposition (`<name>_total`; `_bucket`/`_count`/`_sum`), without
the `_created` samples. Only the event loop's thread may record; a scrape from another thread
reads a copy, so it may miss an increment in progress but never fails.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Labels = tuple[str, ...]


class PlainCounter(Collector):
    """`name` without `_total` (as prometheus_client's Counter takes it). `preset`: label tuples
    shown at zero before their first increment."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        registry: CollectorRegistry,
        preset: Iterable[Labels] = (),
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.values: dict[Labels, float] = dict.fromkeys(preset, 0.0)
        registry.register(self)

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in list(self.values.items()):
            family.add_metric(list(labels), value)
        yield family


class PlainHistogram(Collector):
    """Cumulative buckets with upper bounds `buckets` (ascending; `+Inf` is added)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        *,
        registry: CollectorRegistry,
        preset: Iterable[Labels] = (),
    ) -> None:
        if list(buckets) != sorted(buckets):
            raise ValueError("histogram buckets must be in increasing order")
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.bounds = [float(b) for b in buckets]
        # Per label tuple: a count per bucket (the last one is +Inf), then the sum.
        self._series: dict[Labels, tuple[list[int], list[float]]] = {}
        for labels in preset:
            self._new(labels)
        registry.register(self)

    def _new(self, labels: Labels) -> tuple[list[int], list[float]]:
        series = self._series[labels] = ([0] * (len(self.bounds) + 1), [0.0])
        return series

    def observe(self, labels: Labels, value: float) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._new(labels)
        counts, total = series
        # A value equal to a bound belongs to that bucket (`le`): the first bound >= value.
        counts[bisect.bisect_left(self.bounds, value)] += 1
        total[0] += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, (counts, total) in list(self._series.items()):
            running = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip([*self.bounds, float("inf")], list(counts), strict=True):
                running += count
                buckets.append((floatToGoString(bound), float(running)))  # type: ignore[no-untyped-call]
            family.add_metric(list(labels), buckets, total[0])
        yield family
