"""Per-backend load reports shared between ingress replicas (core NATS, subject
`continuum.ingress.load.<replica>`; every replica subscribes to `continuum.ingress.load.*` and
skips its own subject without decoding it).

Each replica publishes, every `interval_ms`, what it has in flight on every backend it sends to:
requests without a final byte yet and uncached prompt tokens without a first byte yet. Every
other replica adds the latest report of each replica it heard from within its staleness bound
to its own counts, so the CHWBL bound and the KV cost model see the fleet's load, not one
replica's share of it. A report replaces the sender's previous one (sequence numbers order
them); `final` says the sender is stopping (its load is dropped at once instead of at the
staleness bound). A report also carries the OpenAI Responses ids the sender learnt since its
previous report, each with the backend that stored the response, so every process routes a
conversation's next turn to that backend (docs/ingress.md, "Stored Responses conversations").
msgpack via msgspec, tagged arrays:

    [replica, seq, interval_ms, [[backend, in_flight, queued_tokens], ...], final,
     [[response_id, backend], ...]]

The last field is optional both ways: a report without it decodes with none, and a process that
does not know it ignores it (msgspec skips trailing array fields it has no name for), so old and
new processes share one view during an upgrade.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from continuum_common.errors import ContinuumError
from continuum_common.wire.codec import StructCodec

SUBJECT_PREFIX: Final = "continuum.ingress.load."
SUBJECT_WILDCARD: Final = "continuum.ingress.load.*"
MAX_BACKENDS: Final = 4096
MAX_RESPONSES: Final = 1024  # learnt response ids per report

_U63 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]


def subject_for(replica: str) -> str:
    return SUBJECT_PREFIX + replica


class LoadReportDecodeError(ContinuumError, ValueError):
    """A load report that cannot be used (counted and dropped)."""


class BackendLoad(msgspec.Struct, array_like=True, frozen=True):
    backend: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    in_flight: _U63
    queued_tokens: _U63 = 0


class LearnedResponse(msgspec.Struct, array_like=True, frozen=True):
    response_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    backend: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class LoadReport(msgspec.Struct, array_like=True, frozen=True):
    replica: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    seq: _U63
    interval_ms: Annotated[int, msgspec.Meta(ge=1, le=3_600_000)]
    loads: Annotated[list[BackendLoad], msgspec.Meta(max_length=MAX_BACKENDS)]
    final: bool = False
    responses: Annotated[list[LearnedResponse], msgspec.Meta(max_length=MAX_RESPONSES)] = []


_codec = StructCodec(LoadReport, LoadReportDecodeError, "load report")
encode_load_report = _codec.encode
decode_load_report = _codec.decode
