"""The shape every msgpack bus contract of `wire/` shares: one msgspec struct, encoded as is,
decoded with its validation, any failure one contract-specific error (the consumer counts and
drops the message), and an optional bound on the payload checked before decoding."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

T = TypeVar("T")


class StructCodec(Generic[T]):
    """`StructCodec(Decision, DecisionDecodeError, "decision")`: `encode(value)` gives msgpack
    bytes, `decode(payload)` the validated struct or `error("undecodable <what>: ...")`."""

    __slots__ = ("_decoder", "_encoder", "error", "max_bytes", "what")

    def __init__(self, kind: type[T], error: type[Exception], what: str, *, max_bytes: int | None = None) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(kind)
        self.error = error
        self.what = what
        self.max_bytes = max_bytes

    def encode(self, value: T) -> bytes:
        return self._encoder.encode(value)

    def decode(self, payload: bytes) -> T:
        if self.max_bytes is not None and len(payload) > self.max_bytes:
            raise self.error(f"undecodable {self.what}: larger than {self.max_bytes} bytes")
        try:
            return self._decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise self.error(f"undecodable {self.what}: {exc}") from None
