"""The shared load table (pure) and its wire format."""

from __future__ import annotations

import msgspec
import pytest

from continuum_common.wire.loads import (
    MAX_BACKENDS,
    MAX_RESPONSES,
    BackendLoad,
    LearnedResponse,
    LoadReport,
    LoadReportDecodeError,
    decode_load_report,
    encode_load_report,
)
from continuum_ingress.policy.shared_load import SharedLoad


def report(replica: str, seq: int, *loads: tuple[str, int, int], interval_ms: int = 100) -> LoadReport:
    return LoadReport(replica, seq, interval_ms, [BackendLoad(b, n, q) for b, n, q in loads])


def test_reports_replace_each_other_and_sum_over_peers() -> None:
    table = SharedLoad(stale_after_s=1.0)
    assert table.apply(report("r1", 1, ("a", 2, 100), ("b", 1, 0)), now=0.0)
    assert table.apply(report("r2", 1, ("a", 3, 50)), now=0.0)
    totals = table.totals(0.1)
    assert totals.in_flight == {"a": 5, "b": 1}
    assert totals.queued_tokens == {"a": 150, "b": 0}
    assert totals.peers == 2
    assert table.apply(report("r1", 2, ("b", 4, 10)), now=0.2)  # r1 finished on a, more on b
    totals = table.totals(0.2)
    assert totals.in_flight == {"a": 3, "b": 4}
    assert totals.queued_tokens == {"a": 50, "b": 10}


def test_an_older_report_is_refused() -> None:
    table = SharedLoad(stale_after_s=1.0)
    table.apply(report("r1", 5, ("a", 1, 0)), now=0.0)
    assert not table.apply(report("r1", 4, ("a", 9, 0)), now=0.01)
    assert not table.apply(report("r1", 5, ("a", 9, 0)), now=0.01)
    assert table.totals(0.02).in_flight == {"a": 1}


def test_a_final_report_drops_the_peer_at_once() -> None:
    table = SharedLoad(stale_after_s=1.0)
    table.apply(report("r1", 1, ("a", 4, 0)), now=0.0)
    assert table.apply(LoadReport("r1", 2, 100, [], final=True), now=0.01)
    assert table.totals(0.02).in_flight == {}
    assert table.expired == 0


def test_silent_peers_expire_after_the_bound_or_three_of_their_intervals() -> None:
    table = SharedLoad(stale_after_s=1.0)
    table.apply(report("fast", 1, ("a", 1, 0)), now=0.0)
    table.apply(report("slow", 1, ("a", 2, 0), interval_ms=500), now=0.0)
    assert table.totals(1.0).in_flight == {"a": 3}
    totals = table.totals(1.2)  # fast is silent beyond 1 s; slow is given 3 × 500 ms
    assert totals.in_flight == {"a": 2}
    assert table.expired == 1
    assert table.totals(1.6).in_flight == {}
    assert table.expired == 2


def test_bumps_count_until_the_next_report_and_only_for_known_peers() -> None:
    table = SharedLoad(stale_after_s=1.0)
    assert not table.bump("unknown", "a", 10)
    table.apply(report("r1", 1, ("a", 1, 0)), now=0.0)
    assert table.bump("r1", "a", 10)
    assert table.bump("r1", "b", 5)
    totals = table.totals(0.05)
    assert totals.in_flight == {"a": 2, "b": 1}
    assert totals.queued_tokens == {"a": 10, "b": 5}
    table.apply(report("r1", 2, ("a", 2, 10), ("b", 1, 5)), now=0.1)  # the report counts them
    assert table.totals(0.1).in_flight == {"a": 2, "b": 1}


def test_a_backend_listed_twice_adds_up() -> None:
    table = SharedLoad(stale_after_s=1.0)
    table.apply(report("r1", 1, ("a", 1, 3), ("a", 2, 4)), now=0.0)
    assert table.totals(0.0).in_flight == {"a": 3}
    assert table.totals(0.0).queued_tokens == {"a": 7}


def test_wire_round_trip() -> None:
    sent = LoadReport("host-1-abc", 7, 100, [BackendLoad("vllm-1", 3, 12_000)], final=False)
    assert decode_load_report(encode_load_report(sent)) == sent
    final = LoadReport("host-1-abc", 8, 100, [], final=True)
    assert decode_load_report(encode_load_report(final)).final
    learnt = LoadReport("host-1-abc", 9, 100, [], responses=[LearnedResponse("resp_1", "vllm-1")])
    assert decode_load_report(encode_load_report(learnt)).responses == [LearnedResponse("resp_1", "vllm-1")]


class ReportBefore(msgspec.Struct, array_like=True, frozen=True):
    """The report as processes without the Responses ids encode and decode it."""

    replica: str
    seq: int
    interval_ms: int
    loads: list[BackendLoad]
    final: bool = False


def test_reports_with_and_without_response_ids_are_read_by_both_versions() -> None:
    older = msgspec.msgpack.encode(ReportBefore("r-old", 1, 100, [BackendLoad("a", 2, 0)]))
    assert decode_load_report(older) == LoadReport("r-old", 1, 100, [BackendLoad("a", 2, 0)], responses=[])
    newer = encode_load_report(LoadReport("r-new", 2, 100, [], responses=[LearnedResponse("resp_9", "a")]))
    assert msgspec.msgpack.decode(newer, type=ReportBefore) == ReportBefore("r-new", 2, 100, [])


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgspec.msgpack.encode(["r", 1, 100, [["a", -1, 0]], False]),
        msgspec.msgpack.encode(["r", 1, 0, [], False]),
        msgspec.msgpack.encode(["", 1, 100, [], False]),
        msgspec.msgpack.encode(["r", 1, 100, [["a", 1, 0]] * (MAX_BACKENDS + 1), False]),
        msgspec.msgpack.encode(["r", 1, 100, [], False, [["resp_1", "a"]] * (MAX_RESPONSES + 1)]),
        msgspec.msgpack.encode(["r", 1, 100, [], False, [["", "a"]]]),
        msgspec.msgpack.encode({"replica": "r"}),
    ],
)
def test_bad_reports_are_refused_with_a_clear_error(payload: bytes) -> None:
    with pytest.raises(LoadReportDecodeError, match="undecodable load report"):
        decode_load_report(payload)
