"""Routing decisions shared between ingress replicas: the start flag and both versions."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from continuum_common.wire.decisions import (
    KIND_ANSWER,
    KIND_SPECULATIVE,
    Decision,
    DecisionDecodeError,
    decode_decision,
    encode_decision,
)


class _Before(msgspec.Struct, array_like=True, frozen=True):
    """The decision as replicas sent it before the start flag."""

    replica: str
    group: str
    backend: str
    kind: Annotated[int, msgspec.Meta(ge=0, le=1)]
    ts: float
    keys: list[int]
    new_tokens: int = 0


def test_the_start_flag_round_trips() -> None:
    d = Decision("r1", "fleet", "sim-0", KIND_SPECULATIVE, 1.5, [1, 2, 3], 1100, True)
    assert decode_decision(encode_decision(d)) == d
    assert decode_decision(encode_decision(Decision("r1", "fleet", "sim-0", 0, 1.5, [], 0))).start is False


def test_replicas_before_and_after_the_flag_read_each_other() -> None:
    # an older replica's decision is read as "not a start" ...
    old = msgspec.msgpack.encode(_Before("r0", "fleet", "sim-1", KIND_SPECULATIVE, 2.0, [7], 300))
    read = decode_decision(old)
    assert (read.backend, read.keys, read.new_tokens, read.start) == ("sim-1", [7], 300, False)
    # ... and an older replica reads a newer one's, ignoring the flag
    new = encode_decision(Decision("r1", "fleet", "sim-0", KIND_SPECULATIVE, 2.0, [9], 1100, True))
    assert msgspec.msgpack.decode(new, type=_Before) == _Before(
        "r1", "fleet", "sim-0", KIND_SPECULATIVE, 2.0, [9], 1100
    )


def test_answer_records_round_trip_and_older_replicas_refuse_them() -> None:
    d = Decision("r1", "fleet", "sim-0", KIND_ANSWER, 3.0, [4, 5, 6], 0)
    assert decode_decision(encode_decision(d)) == d
    # an older replica cannot decode the new kind: its decoder drops the message (counted as
    # undecodable) instead of taking it for a request
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(encode_decision(d), type=_Before)
    with pytest.raises(DecisionDecodeError):
        decode_decision(msgspec.msgpack.encode(["r0", "fleet", "sim-1", KIND_ANSWER + 1, 1.0, [1], 0]))
