"""Turn one JetStream message (subject + payload) into a version-1 KvEvent (prefix-key index)
or a version-2 KvBatch (block index), or say why it is dropped."""

from __future__ import annotations

from continuum_common.events import SUBJECT_PREFIX, KvEvent
from continuum_common.kvindex.block_pack import MAX_SEQ
from continuum_common.wire.kv import BatchDecodeError, KvBatch, decode_bus_payload
from continuum_indexer.errors import DroppedEvent


def subject_backend(subject: str) -> str | None:
    if not subject.startswith(SUBJECT_PREFIX):
        return None
    return subject[len(SUBJECT_PREFIX) :] or None


def _reason(exc: BatchDecodeError) -> str:
    # The decoder bounds a batch's events and hashes (wire.kv.MAX_*); those refusals are
    # counted apart from undecodable payloads.
    return "too_large" if str(exc).startswith("too many") else "decode"


def decode_bus_message(subject: str, payload: bytes) -> KvEvent | KvBatch:
    """The event or batch in `payload`; DroppedEvent when it cannot be decoded, is over the
    decoder's bounds, names another backend than its subject (listener credentials may
    publish only their own backends' subjects, so the subject is the authority), or carries
    a `seq` the block index cannot stamp exactly."""
    backend = subject_backend(subject)
    try:
        item = decode_bus_payload(payload)
    except BatchDecodeError as exc:
        raise DroppedEvent(_reason(exc), str(exc), backend) from None
    if item.backend != backend:
        raise DroppedEvent("backend_mismatch", "payload backend differs from the subject", backend)
    if isinstance(item, KvBatch) and item.seq >= MAX_SEQ:
        raise DroppedEvent("invalid", f"batch seq {item.seq} is not below 2**37", backend)
    return item
