"""The block index: which backend holds which engine block, fed by version-2 KV batches
(continuum_common.wire.kv). The read the ingress makes is a longest-prefix match of a request's
block-hash chain, per backend.

Semantics every implementation (memory, Redis, Redis Cluster) follows, checked by one
behavioural suite:

* State is per backend: for each block hash a GPU register and a storage register, each a
  last-writer-wins `(stamp, present)` pair. A stamp orders events inside one epoch:
  `stamp = seq * 65536 + index of the event in its batch`, so a store and a removal of the same
  block in one batch apply in order.
* `BlocksStored(tier)` sets the tier's register of each hash to present, `BlocksRemoved(tier)`
  to absent, each only when its stamp is newer than the register's (reordered or redelivered
  batches converge to the in-order result; removals leave tombstones for `tombstone_seconds`).
* `AllCleared` at stamp s: every register of the backend stamped at or below s reads absent.
* A batch of an older epoch than the backend's newest is stale and ignored. The first batch of
  a newer epoch drops the backend's whole state first (every epoch starts with AllCleared; this
  covers it arriving late).
* Every batch, keepalives (empty batches) included, refreshes the backend's liveness. A backend
  without a batch for `ttl_seconds` reads as holding nothing, and its state is dropped.
* At most `max_blocks` present blocks per backend (per tier): beyond it the oldest stored go.
* `generation` of a backend changes whenever its holdings are wiped (AllCleared, new epoch,
  expiry); the ingress uses it to forget what it recorded locally about that backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from continuum_common.wire.kv import KvBatch


class BlockMatch(NamedTuple):
    """How much of a chain one backend holds."""

    gpu_blocks: int  # leading blocks of the chain held in GPU memory
    any_blocks: int  # leading blocks held in GPU or a storage tier (>= gpu_blocks)
    held_blocks: int  # blocks the backend holds on GPU in all (its cache fill, for capacity)
    generation: int  # changes whenever the backend's holdings were wiped


NO_MATCH = BlockMatch(0, 0, 0, 0)


class MatchQuery(NamedTuple):
    chain: Sequence[int]  # u64 block hashes, root first
    backends: Sequence[str]


@runtime_checkable
class BlockIndexReader(Protocol):
    async def match_many(self, queries: Sequence[MatchQuery]) -> list[dict[str, BlockMatch]]:
        """For each query, every backend it names → its match (NO_MATCH-like zeros for a backend
        the index knows nothing about). One round trip for all queries."""
        ...


@dataclass(slots=True)
class BlockApplyReport:
    batches: int = 0
    applied: int = 0  # block registers changed
    # block events older than what the register (or the backend's clear) records, including
    # every block event of a stale batch: applied + stale == the block events of the batches
    stale: int = 0
    stale_batches: int = 0  # whole batches of an older epoch
    clears: int = 0
    evicted: int = 0  # present blocks dropped by the max_blocks bound
    # Backends whose state the index had to start from a batch that does not begin an epoch
    # (it knew nothing of them: a store that lost its data, expired keys, a consumer that
    # joined late): the index misses their history until their source restates it (a resync).
    gaps: set[str] = field(default_factory=set)

    def merge(self, other: BlockApplyReport) -> None:
        self.batches += other.batches
        self.applied += other.applied
        self.stale += other.stale
        self.stale_batches += other.stale_batches
        self.clears += other.clears
        self.evicted += other.evicted
        self.gaps |= other.gaps


@dataclass(frozen=True, slots=True)
class BlockBackendStats:
    gpu_blocks: int
    storage_blocks: int
    source_epoch: int
    last_batch_age_s: float | None
    generation: int
    # What applying this backend's batches did since its state was created (fleet-wide on
    # Redis; reset when the backend expires). Same meanings as BlockApplyReport's fields.
    batches: int = 0
    applied: int = 0
    stale: int = 0
    stale_batches: int = 0
    clears: int = 0
    evicted: int = 0


@dataclass(frozen=True, slots=True)
class BlockIndexStats:
    backends: Mapping[str, BlockBackendStats] = field(default_factory=dict)

    @property
    def block_count(self) -> int:
        return sum(b.gpu_blocks + b.storage_blocks for b in self.backends.values())


@runtime_checkable
class BlockIndexWriter(Protocol):
    async def apply_batches(self, batches: Sequence[KvBatch]) -> BlockApplyReport:
        """Apply in any order, any number of times (see the module docstring). Raises
        KvIndexError when the store failed; the whole call may then be retried."""
        ...

    async def cleanup(self) -> int:
        """Drop expired backends, old tombstones; return how many entries went."""
        ...

    async def block_stats(self) -> BlockIndexStats: ...

    async def clear_blocks(self) -> int:
        """Forget every backend's blocks (admin); returns how many present blocks went."""
        ...
