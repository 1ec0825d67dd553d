"""The request path's plain counter and histogram expose what prometheus_client's Counter and
Histogram would (minus `_created`)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from continuum_ingress.plain_metrics import PlainCounter, PlainHistogram

BUCKETS = (0.001, 0.01, 0.1, 1, 10)


def _lines(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if "_created" not in line)


def test_counter_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainCounter("x_requests", "Requests", ["endpoint", "status"], registry=ours, preset=[("chat", "5xx")])
    reference = Counter("x_requests", "Requests", ["endpoint", "status"], registry=theirs)
    reference.labels("chat", "5xx")
    for labels, amount in [(("chat", "2xx"), 1.0), (("chat", "2xx"), 2.5), (("embed", "4xx"), 1.0)]:
        plain.inc(labels, amount)
        reference.labels(*labels).inc(amount)
    assert _lines(ours) == _lines(theirs)
    assert ours.get_sample_value("x_requests_total", {"endpoint": "chat", "status": "2xx"}) == 3.5
    assert ours.get_sample_value("x_requests_total", {"endpoint": "chat", "status": "5xx"}) == 0.0


def test_histogram_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainHistogram("x_seconds", "Time", ["endpoint"], BUCKETS, registry=ours, preset=[("idle",)])
    reference = Histogram("x_seconds", "Time", ["endpoint"], buckets=BUCKETS, registry=theirs)
    reference.labels("idle")
    # Values on a bound belong to that bucket; past the last bound only +Inf counts them.
    for value in (0.0005, 0.001, 0.05, 0.1, 3.0, 10.0, 99.0):
        plain.observe(("chat",), value)
        reference.labels("chat").observe(value)
    assert _lines(ours) == _lines(theirs)
    assert ours.get_sample_value("x_seconds_bucket", {"endpoint": "chat", "le": "0.1"}) == 4
    assert ours.get_sample_value("x_seconds_count", {"endpoint": "chat"}) == 7


def test_histogram_buckets_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        PlainHistogram("y", "Y", [], (1.0, 0.5), registry=CollectorRegistry())
