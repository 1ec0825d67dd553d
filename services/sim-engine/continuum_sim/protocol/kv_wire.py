"""KV-cache events and their exact wire encodings (kv-events-spec.md §1.1-1.6, §2).

The block pool produces `StoredEvent` / `RemovedEvent` / `ClearedEvent` values; `encode_batch`
turns the events of one scheduler step into the msgpack payload of one `KVEventBatch`, in the
selected era:

* ``array`` — vLLM bcb9c13 (2026-05-12), the last array-encoded layout: BlockStored is a
  12-element tagged array, BlockRemoved a 4-element one; replay replies `[seq, payload]`.
* ``map`` — vLLM 426d48b (2026-07-17, current): events are tagged maps with default-valued keys
  omitted (msgspec `omit_defaults`), the batch stays an array; replay replies
  `[topic, seq, payload]` (vLLM ≥ 2f3f441f).
* ``sglang`` — SGLang bd3f6a7: one BlockStored per page, one BlockRemoved per evicted group,
  7- and 3-element arrays; replay replies `[seq, payload]`.

msgpack-python with `use_bin_type=True` writes the same bytes as msgspec for these shapes
(checked byte-for-byte against the fixtures in tests/unit/test_sim_kv_wire.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgpack

from continuum_sim.protocol.block_hash import HashWire, sglang_wire_hash, vllm_wire_hash

Era = Literal["array", "map", "sglang"]
ERAS: tuple[Era, ...] = ("array", "map", "sglang")
MEDIUM_GPU = "GPU"
SPEC_KIND = "full_attention"
END_SEQ = b"\xff" * 8


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """Newly cached full blocks of one request, in chain order (one `cache_full_blocks` call)."""

    digests: tuple[bytes, ...]
    parent: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    extra_keys: tuple[tuple[object, ...] | None, ...]


@dataclass(frozen=True, slots=True)
class RemovedEvent:
    digests: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ClearedEvent:
    pass


KvEvent = StoredEvent | RemovedEvent | ClearedEvent


def _extra_keys_wire(keys: Sequence[tuple[object, ...] | None]) -> list[list[object] | None]:
    return [None if k is None else list(k) for k in keys]


class BatchEncoder:
    """Encodes one step's events as a `KVEventBatch` payload for one era and hash mode."""

    def __init__(self, era: Era, hash_wire: HashWire = "int", data_parallel_rank: int = 0) -> None:
        if era not in ERAS:
            raise ValueError(f"unknown KV event era {era!r}")
        self.era: Era = era
        self.hash_wire: HashWire = hash_wire
        self.data_parallel_rank = data_parallel_rank

    def _h(self, digest: bytes) -> int | bytes:
        if self.era == "sglang":
            return sglang_wire_hash(digest)
        return vllm_wire_hash(digest, self.hash_wire)

    def encode(self, ts: float, events: Sequence[KvEvent]) -> bytes:
        payload: bytes = msgpack.packb(self.batch(ts, events), use_bin_type=True)
        return payload

    def batch(self, ts: float, events: Sequence[KvEvent]) -> list[object]:
        """The generic (decoded) form of the batch: what msgpack.unpackb would return."""
        wire = self._sglang_events(events) if self.era == "sglang" else [self._vllm_event(e) for e in events]
        return [ts, wire, self.data_parallel_rank]

    def _vllm_event(self, event: KvEvent) -> object:
        if isinstance(event, StoredEvent):
            hashes = [self._h(d) for d in event.digests]
            parent = None if event.parent is None else self._h(event.parent)
            extra = _extra_keys_wire(event.extra_keys)
            if self.era == "array":
                return [
                    "BlockStored", hashes, parent, list(event.token_ids), event.block_size,
                    None, MEDIUM_GPU, None, extra, 0, SPEC_KIND, None,
                ]  # fmt: skip
            return {
                "type": "BlockStored",
                "block_hashes": hashes,
                "parent_block_hash": parent,
                "token_ids": list(event.token_ids),
                "block_size": event.block_size,
                "lora_id": None,
                "medium": MEDIUM_GPU,
                "lora_name": None,
                "extra_keys": extra,
                "group_idx": 0,
                "kv_cache_spec_kind": SPEC_KIND,
            }
        if isinstance(event, RemovedEvent):
            hashes = [self._h(d) for d in event.digests]
            if self.era == "array":
                return ["BlockRemoved", hashes, MEDIUM_GPU, 0]
            return {"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM_GPU, "group_idx": 0}
        return ["AllBlocksCleared"] if self.era == "array" else {"type": "AllBlocksCleared"}

    def _sglang_events(self, events: Sequence[KvEvent]) -> list[object]:
        out: list[object] = []
        pending_removed: list[int | bytes] = []
        for event in events:
            if isinstance(event, RemovedEvent):
                # SGLang evicts radix nodes: consecutive evictions of one step form one event.
                pending_removed += [self._h(d) for d in event.digests]
                continue
            if pending_removed:
                out.append(["BlockRemoved", pending_removed, MEDIUM_GPU])
                pending_removed = []
            if isinstance(event, StoredEvent):
                parent = None if event.parent is None else self._h(event.parent)
                size = event.block_size
                for i, digest in enumerate(event.digests):
                    page = list(event.token_ids[i * size : (i + 1) * size])
                    hashed = self._h(digest)
                    out.append(["BlockStored", [hashed], parent, page, size, None, MEDIUM_GPU])
                    parent = hashed
            else:
                out.append(["AllBlocksCleared"])
        if pending_removed:
            out.append(["BlockRemoved", pending_removed, MEDIUM_GPU])
        return out


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def pub_frames(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """One PUB message: `[topic, u64be seq, payload]`."""
    return [topic, seq_frame(seq), payload]


def replay_reply_frames(era: Era, topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """One replay reply as a REQ client sees it (a ROUTER prepends `[identity, b""]`)."""
    if era == "map":
        return [topic, seq_frame(seq), payload]
    return [seq_frame(seq), payload]


def replay_end_frames(era: Era) -> list[bytes]:
    if era == "map":
        return [b"", END_SEQ, b""]
    return [END_SEQ, b""]
