"""Normalized KV event encoding and the salt-echo format."""

from __future__ import annotations

import hashlib

import msgpack
import orjson
import pytest

from continuum_common.events import EventDecodeError, EventType, KvEvent, Tier, decode_event, subject_for
from continuum_common.salt import make_salt, verify_salt

H = hashlib.sha256(b"x").hexdigest()


def event(**kw: object) -> KvEvent:
    base = {
        "backend": "vllm-1",
        "source_epoch": 7,
        "seq": 3,
        "ts": 1.5,
        "type": EventType.CREATED,
        "prefix_hash": H,
        "token_count": 512,
        "tier": Tier.GPU_HOT,
    }
    base.update(kw)
    return KvEvent(**base)  # type: ignore[arg-type]


def test_round_trip_msgpack_and_json() -> None:
    e = event()
    assert decode_event(e.encode()) == e
    assert decode_event(orjson.dumps(e.to_dict())) == e
    assert e.msg_id == "vllm-1:7:3" and e.subject == "continuum.kv.events.vllm-1"


def test_cleared_has_no_prefix() -> None:
    e = event(type=EventType.CLEARED, prefix_hash=None, token_count=0)
    assert decode_event(e.encode()).prefix_hash is None


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        b"[1,2]",
        b"{not json",
        msgpack.packb([1, 2]),
        msgpack.packb({"v": 2}),
        msgpack.packb({**event().to_dict(), "prefix_hash": "XYZ"}),
        msgpack.packb({**event().to_dict(), "type": "exploded"}),
        msgpack.packb({**event().to_dict(), "backend": "a b"}),
        msgpack.packb({**event().to_dict(), "token_count": -1}),
        msgpack.packb({**event().to_dict(), "seq": "3"}),
        msgpack.packb({**event().to_dict(), "tier": "cold"}),
    ],
)
def test_bad_payloads_raise_only_event_decode_error(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_event(payload)


def test_subject_rejects_bad_backend() -> None:
    with pytest.raises(EventDecodeError):
        subject_for("a.b")


def test_salt_round_trip_and_binding() -> None:
    key = hashlib.sha256(b"prefix").digest()
    salt = make_salt(b"secret", "vllm-1", key)
    assert len(salt) == 101 and salt.startswith("cr1.")
    assert verify_salt(b"secret", "vllm-1", salt) == key
    assert verify_salt(b"secret", "vllm-2", salt) is None  # bound to the backend
    assert verify_salt(b"other", "vllm-1", salt) is None  # bound to the secret
    forged = salt[:-1] + ("0" if salt[-1] != "0" else "1")
    assert verify_salt(b"secret", "vllm-1", forged) is None
    for junk in (None, 5, "", "cr1.", "tenant-a", salt.replace(".", "-"), "cr1." + "zz" * 50):
        assert verify_salt(b"secret", "vllm-1", junk) is None
