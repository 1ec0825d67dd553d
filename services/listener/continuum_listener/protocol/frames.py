"""ZMQ multipart framing of vLLM / SGLang KV events (kv-events-spec §1.1, §1.2).

PUB:     [topic, u64be(seq), msgpack payload]              exactly three frames
Replay:  request  [b"", u64be(start_seq)]                   (DEALER → ROUTER)
         reply    [b"", u64be(seq), payload]                vLLM before 2f3f441f, SGLang
                  [b"", topic, u64be(seq), payload]         vLLM since 2f3f441f (2026-07-07)
         end      the 8-byte all-ff seq with an empty payload, in either shape
"""

from __future__ import annotations

from dataclasses import dataclass

from continuum_listener.errors import DecodeError

SEQ_BYTES = 8
END_SEQ = b"\xff" * SEQ_BYTES


@dataclass(frozen=True, slots=True)
class Frame:
    seq: int
    payload: bytes


def parse_pub(frames: list[bytes]) -> Frame:
    """The seq and payload of one PUB message; DecodeError("frames") for any other shape."""
    if len(frames) != 3:
        raise DecodeError("frames", f"expected 3 frames, got {len(frames)}")
    seq = frames[1]
    if len(seq) != SEQ_BYTES:
        raise DecodeError("frames", f"seq frame has {len(seq)} bytes, expected 8")
    return Frame(int.from_bytes(seq, "big"), frames[2])


def replay_request(start_seq: int) -> list[bytes]:
    return [b"", start_seq.to_bytes(SEQ_BYTES, "big")]


def parse_replay(frames: list[bytes]) -> Frame | None:
    """One replay reply as a DEALER receives it; None for the end marker.

    Both reply shapes are accepted; the end marker is recognized by its all-ff seq and empty
    payload rather than by frame count, as the spec recommends."""
    body = frames[1:] if frames and frames[0] == b"" else frames
    if len(body) == 2:
        seq, payload = body
    elif len(body) == 3:
        _topic, seq, payload = body
    else:
        raise DecodeError("frames", f"replay reply has {len(frames)} frames")
    if len(seq) != SEQ_BYTES:
        raise DecodeError("frames", "replay seq frame is not 8 bytes")
    if seq == END_SEQ and not payload:
        return None
    return Frame(int.from_bytes(seq, "big"), payload)
