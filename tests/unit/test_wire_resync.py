"""Resync requests: the wire format and the per-backend throttle both sides use."""

from __future__ import annotations

import pytest

from continuum_common.wire.resync import (
    ResyncRequest,
    ResyncRequestDecodeError,
    ResyncThrottle,
    decode_resync_request,
    encode_resync_request,
    subject_for,
)


def test_round_trip_and_subject() -> None:
    request = ResyncRequest("vllm-1", "index_gap", "continuum-indexer")
    assert decode_resync_request(encode_resync_request(request)) == request
    assert subject_for("vllm-1") == "continuum.kv.resync.vllm-1"


@pytest.mark.parametrize("payload", [b"", b"\xc1", b"\x93\xa0\xa0\xa0", b"\x91\x05"])
def test_bad_payloads_raise_the_decode_error(payload: bytes) -> None:
    with pytest.raises(ResyncRequestDecodeError):
        decode_resync_request(payload)


def test_throttle_asks_once_per_interval_per_backend() -> None:
    now = [100.0]
    throttle = ResyncThrottle(10.0, clock=lambda: now[0])
    assert throttle.due(["b", "a", "a"]) == (["a", "b"], [])
    now[0] += 5
    assert throttle.due(["a", "c"]) == (["c"], ["a"])
    now[0] += 5.5
    assert throttle.due(["a", "b", "c"]) == (["a", "b"], ["c"])


def test_throttle_memory_is_bounded() -> None:
    now = [0.0]
    throttle = ResyncThrottle(10.0, clock=lambda: now[0])
    for i in range(5000):
        now[0] += 0.001
        throttle.due([f"backend-{i}"])
    assert len(throttle._last) <= 4096
    assert throttle.due(["backend-4999"]) == ([], ["backend-4999"])  # the newest are kept
