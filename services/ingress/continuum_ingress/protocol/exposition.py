"""Prometheus text expositions of several processes merged into one (pure; no I/O).

The workers of one `serve` each keep their own metrics; the one a scrape reaches answers for
all of them (adapters/worker_metrics.py). Every sample gets a `worker` label naming the process
it came from, unless it already carries one (the supervisor's per-worker restart counter);
families of the same name are merged, and a family whose type disagrees with the first one
seen under its name is left out (it cannot be expressed in one family).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from continuum_common.errors import ContinuumError

LABEL = "worker"


class ExpositionError(ContinuumError, ValueError):
    """A text exposition that does not parse."""


def parse(text: bytes) -> list[Metric]:
    return list(families(text))


def families(text: bytes) -> Iterator[Metric]:
    """The families of `text`, parsed one at a time as they are taken (a caller on an event
    loop can give the loop a turn between them); ExpositionError when the text does not parse."""
    try:
        yield from text_string_to_metric_families(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, IndexError, KeyError) as exc:
        raise ExpositionError(f"unreadable metrics exposition: {type(exc).__name__}") from None


def merge(sources: Iterable[tuple[str | None, Sequence[Metric]]]) -> list[Metric]:
    """One family per name, in first-seen order. `sources`: (the `worker` label value, or None
    to add none, that process's families)."""
    merged: dict[str, Metric] = {}
    for value, families in sources:
        for family in families:
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation, family.type)
            elif target.type != family.type:
                continue
            for sample in family.samples:
                labels = sample.labels
                if value is not None and LABEL not in labels:
                    labels = {**labels, LABEL: value}
                target.samples.append(Sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar))
    return list(merged.values())
