"""Pure helpers of the block index shared by its implementations: stamps, grouping a pull
batch's KvBatches per backend, and the binary packing the Redis scripts read.

Stamps: `seq * 65536 + index of the event in its batch`. Redis keeps them as sorted-set scores
and Lua numbers, both IEEE doubles, exact below 2**53; so `seq` must stay below 2**37
(`MAX_SEQ`: a listener epoch of 4 years at 1,000 batches a second). Batches at or above it are
refused by the indexer (counted as `invalid`) and read as stale by both indexes.

Packed batch (one Lua argument per batch; big-endian):

    epoch   20 ASCII digits (zero-padded; byte order == numeric order for any u64)
    base    f64   seq * 65536 (the stamp of event 0)
    count   u32   number of events
    then per event:
      kind u8 (1 stored, 2 removed, 3 cleared), tier u8, n u32, n x u64 hashes

Packed chain: the hashes as u64, 8 bytes each, in chain order (one argument for any length:
the Python client spends microseconds per argument, Lua slices the string).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Final

from continuum_common.wire.kv import AllCleared, BlocksStored, KvBatch

EVENT_STAMPS: Final = 65_536
MAX_SEQ: Final = 1 << 37
KIND_STORED: Final = 1
KIND_REMOVED: Final = 2
KIND_CLEARED: Final = 3

_HEADER = struct.Struct(">dI")
_EVENT = struct.Struct(">BBI")
_CLEARED = _EVENT.pack(KIND_CLEARED, 0, 0)


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


def pack_batch(batch: KvBatch) -> bytes:
    parts = [b"%020d" % batch.source_epoch, _HEADER.pack(float(batch.seq * EVENT_STAMPS), len(batch.events))]
    for event in batch.events:
        if isinstance(event, AllCleared):
            parts.append(_CLEARED)
            continue
        n = len(event.hashes)
        kind = KIND_STORED if isinstance(event, BlocksStored) else KIND_REMOVED
        parts.append(_EVENT.pack(kind, event.tier, n))
        if n:
            parts.append(struct.pack(f">{n}Q", *event.hashes))
    return b"".join(parts)


def pack_chain(chain: Sequence[int]) -> bytes:
    return struct.pack(f">{len(chain)}Q", *chain)


def split_by_size(batches: Sequence[KvBatch], max_blocks: int) -> list[list[KvBatch]]:
    """Consecutive runs of batches holding at most `max_blocks` block events each (a single
    bigger batch is a run of its own): bounds how long one script call holds Redis."""
    runs: list[list[KvBatch]] = []
    run: list[KvBatch] = []
    size = 0
    for batch in batches:
        count = batch.block_count
        if run and size + count > max_blocks:
            runs.append(run)
            run, size = [], 0
        run.append(batch)
        size += count
    if run:
        runs.append(run)
    return runs
