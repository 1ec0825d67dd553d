"""Pure helpers of the block index shared by its implementations: stamps, grouping a pull
batch's KvBatches per backend, and the binary packing the Redis scripts read.

Stamps: `seq * 65536 + index of the event in its batch`. Redis keeps them as hash values,
sorted-set scores and Lua numbers, the last two IEEE doubles, exact below 2**53; so `seq` must
stay below 2**37 (`MAX_SEQ`: a listener epoch of 4 years at 1,000 batches a second). Batches at
or above it are refused by the indexer (counted as `invalid`) and read as stale by both indexes.

A batch is packed as one or more parts (one Lua argument each; big-endian):

    epoch   20 ASCII digits (zero-padded; byte order == numeric order for any u64)
    base    f64   the stamp of the part's first event (seq * 65536 + its index in the batch)
    count   u32   events in the part (their stamps are base, base + 1, ...)
    more    u8    0 for a batch's first part, 1 for the rest (counted once as a batch)
    then per event:
      kind u8 (1 stored, 2 removed, 3 cleared), tier u8, n u32, n x u64 hashes

A batch holding more than `max_blocks` block events is split into parts at event boundaries,
and a single event holding more is split into several events of the same stamp, each in a
part of its own. So no script call has to take more than about `max_blocks` blocks, whatever
the (decoder-bounded) size of a batch.

Packed chain: the hashes as u64, 8 bytes each, in chain order (one argument for any length:
the Python client spends microseconds per argument, Lua slices the string).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Final, NamedTuple, TypeVar

from continuum_common.wire.kv import AllCleared, BlocksStored, KvBatch

EVENT_STAMPS: Final = 65_536
MAX_SEQ: Final = 1 << 37
KIND_STORED: Final = 1
KIND_REMOVED: Final = 2
KIND_CLEARED: Final = 3

_HEADER = struct.Struct(">dIB")
_EVENT = struct.Struct(">BBI")
_CLEARED = _EVENT.pack(KIND_CLEARED, 0, 0)
T = TypeVar("T")


class Part(NamedTuple):
    packed: bytes
    blocks: int  # block events in it


def stamp(seq: int, index: int) -> int:
    return seq * EVENT_STAMPS + index


def seq_in_range(batch: KvBatch) -> bool:
    return batch.seq < MAX_SEQ


def group_by_backend(batches: Iterable[KvBatch]) -> dict[str, list[KvBatch]]:
    """Batches per backend, each list in arrival order (dicts keep first-seen order)."""
    groups: dict[str, list[KvBatch]] = {}
    for batch in batches:
        group = groups.get(batch.backend)
        if group is None:
            groups[batch.backend] = [batch]
        else:
            group.append(batch)
    return groups


def _event(kind: int, tier: int, hashes: Sequence[int]) -> bytes:
    n = len(hashes)
    return _EVENT.pack(kind, tier, n) + (struct.pack(f">{n}Q", *hashes) if n else b"")


def pack_parts(batch: KvBatch, max_blocks: int = 1 << 62) -> list[Part]:
    """The batch as parts of at most about `max_blocks` block events (see the module doc)."""
    epoch = b"%020d" % batch.source_epoch
    parts: list[Part] = []
    body: list[bytes] = []
    first = blocks = 0

    def close(next_index: int, *, last: bool = False) -> None:
        nonlocal body, first, blocks
        if body or (last and not parts):  # an empty batch (a keepalive) is one empty part
            header = _HEADER.pack(float(stamp(batch.seq, first)), len(body), 1 if parts else 0)
            parts.append(Part(epoch + header + b"".join(body), blocks))
        body, first, blocks = [], next_index, 0

    for index, event in enumerate(batch.events):
        if isinstance(event, AllCleared):
            body.append(_CLEARED)
            continue
        kind = KIND_STORED if isinstance(event, BlocksStored) else KIND_REMOVED
        hashes = event.hashes
        if blocks + len(hashes) <= max_blocks:
            body.append(_event(kind, event.tier, hashes))
            blocks += len(hashes)
            continue
        close(index)  # the event starts a part of its own, split while it is too big
        for start in range(0, len(hashes), max_blocks):
            piece = hashes[start : start + max_blocks]
            body.append(_event(kind, event.tier, piece))
            blocks = len(piece)
            if start + max_blocks < len(hashes):
                close(index)
    close(len(batch.events), last=True)
    return parts


def pack_chain(chain: Sequence[int]) -> bytes:
    return struct.pack(f">{len(chain)}Q", *chain)


def split_by_size(items: Sequence[T], max_blocks: int, size: Callable[[T], int]) -> list[list[T]]:
    """Consecutive runs of items holding at most `max_blocks` block events each (a single
    bigger item is a run of its own)."""
    runs: list[list[T]] = []
    run: list[T] = []
    total = 0
    for item in items:
        count = size(item)
        if run and total + count > max_blocks:
            runs.append(run)
            run, total = [], 0
        run.append(item)
        total += count
    if run:
        runs.append(run)
    return runs


def batch_blocks(batch: KvBatch) -> int:
    return batch.block_count
