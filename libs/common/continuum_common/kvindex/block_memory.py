"""InMemoryBlockIndex: the block index inside one process (embedded memory mode, no Redis),
with the semantics of continuum_common.kvindex.blocks (the same behavioural suite as the Redis
index checks it).

Layout, per backend and tier:

* `present`: hash -> stamp of the store that made it present, in arrival order (an
  OrderedDict: a re-store moves the hash to the end; `max_blocks` pops from the front, so the
  oldest stored go first);
* two tombstone generations, hash -> stamp of the removal (or eviction): a removal writes the
  current one; every `tombstone_seconds` (or when the current one holds more than twice
  `max_blocks`) the current one becomes the previous one and the previous one is dropped, so a
  tombstone lives between one and two windows. `tmax` (the newest tombstone stamp) lets a store
  newer than every tombstone (in-order delivery: nearly every store) skip the lookups.

A register's `(stamp, present)` is the newest of those records, and a clear watermark reads
every register at or below it as absent.

For the longest-prefix match the index also keeps, per tier, hash -> bitmask of the backends
holding it (one bit per known backend), so a chain is walked once for all backends: per block
two dict lookups and some bit arithmetic, whatever the number of backends.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.kvindex.block_pack import seq_in_range, stamp
from continuum_common.kvindex.blocks import (
    NO_MATCH,
    BlockApplyReport,
    BlockBackendStats,
    BlockIndexStats,
    BlockMatch,
    MatchQuery,
)
from continuum_common.wire.kv import AllCleared, BlocksStored, KvBatch

DEFAULT_TOMBSTONE_SECONDS = 120.0
_GPU, _STORAGE = 0, 1


class _Tier:
    __slots__ = ("old_tombs", "present", "tombs")

    def __init__(self) -> None:
        self.present: OrderedDict[int, int] = OrderedDict()
        self.tombs: dict[int, int] = {}
        self.old_tombs: dict[int, int] = {}

    def clear(self) -> None:
        self.present.clear()
        self.tombs = {}
        self.old_tombs = {}

    def tomb(self, block: int) -> int:
        a = self.tombs.get(block, -1)
        b = self.old_tombs.get(block, -1)
        return a if a > b else b


class _Backend:
    __slots__ = ("bit", "epoch", "generation", "last_batch", "rotated_at", "tiers", "tmax", "totals", "watermark")

    def __init__(self, bit: int, epoch: int, generation: int, now: float, tiers: tuple[_Tier, _Tier]) -> None:
        self.bit = bit
        self.epoch = epoch
        self.generation = generation
        self.last_batch = now
        self.rotated_at = now
        self.watermark = -1  # stamp of the newest AllCleared applied in this epoch
        self.tmax = -1  # newest tombstone stamp (an upper bound)
        self.tiers = tiers
        self.totals = BlockApplyReport()


def _stopped(bits: int, position: int, out: dict[int, int]) -> None:
    while bits:
        low = bits & -bits
        out[low] = position
        bits ^= low


class InMemoryBlockIndex:
    def __init__(
        self,
        *,
        max_blocks: int = 100_000,
        ttl_seconds: float = 600.0,
        tombstone_seconds: float = DEFAULT_TOMBSTONE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_blocks = max_blocks
        self.ttl = float(ttl_seconds)
        self.tombstone_seconds = float(tombstone_seconds)
        self._clock = clock
        self._backends: dict[str, _Backend] = {}
        # per tier: block hash -> bitmask of the backends holding it
        self._owners: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self._free_bits: list[int] = []
        self._spare_tiers: list[tuple[_Tier, _Tier]] = []  # registers made ahead (reserve)
        self._next_bit = 0
        self._generations = itertools.count(1)

    @classmethod
    def from_config(
        cls,
        cfg: KvCacheIndex,
        *,
        tombstone_seconds: float = DEFAULT_TOMBSTONE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> InMemoryBlockIndex:
        return cls(
            max_blocks=cfg.max_entries,
            ttl_seconds=cfg.entry_ttl_seconds,
            tombstone_seconds=tombstone_seconds,
            clock=clock,
        )

    def reserve(self, backends: int) -> None:
        """Make the registers of `backends` backends now; the first backends that send events
        take them, and a backend's registers are emptied in place (a new epoch) or kept for the
        next one (expiry), never replaced. Why: a long-running process freezes what exists at
        start-up out of the cyclic garbage collector's view (the ingress's `gc.freeze()`), and
        each backend's ordered dictionary of present blocks grows to `max_blocks` entries,
        which every full collection would otherwise walk."""
        self._spare_tiers += [(_Tier(), _Tier()) for _ in range(max(0, backends))]

    # ---- read side -------------------------------------------------------------------------

    def match_nowait(self, chain: Sequence[int], backends: Iterable[str]) -> dict[str, BlockMatch]:
        """Every named backend -> how many leading blocks of `chain` it holds (synchronous:
        the ingress calls it without awaiting). The chain is walked once for all backends."""
        now = self._clock()
        wanted: list[tuple[str, _Backend]] = []
        out: dict[str, BlockMatch] = {}
        want = 0
        for name in backends:
            backend = self._live(name, now)
            out[name] = NO_MATCH  # keeps the query's order
            if backend is not None:
                wanted.append((name, backend))
                want |= backend.bit
        if not wanted:
            return out
        gpu_len, any_len = self._walk(chain, want)
        n = len(chain)
        for name, backend in wanted:
            bit = backend.bit
            out[name] = BlockMatch(
                gpu_len.get(bit, n), any_len.get(bit, n), len(backend.tiers[_GPU].present), backend.generation
            )
        return out

    def _walk(self, chain: Sequence[int], want: int) -> tuple[dict[int, int], dict[int, int]]:
        """For each backend bit in `want` that stops matching before the chain's end: the
        position where it stopped (GPU-held, and GPU-or-storage-held)."""
        gpu_get = self._owners[_GPU].get
        storage = self._owners[_STORAGE]
        gpu_len: dict[int, int] = {}
        if not storage:  # no storage tier anywhere: one lookup per block
            mask = want
            # map() does the lookups in C; the loop only looks at the masks
            for i, owners in enumerate(map(gpu_get, chain, itertools.repeat(0))):
                held = owners & mask
                if held != mask:
                    _stopped(mask ^ held, i, gpu_len)
                    mask = held
                    if not mask:
                        break
            return gpu_len, gpu_len
        storage_get = storage.get
        any_len: dict[int, int] = {}
        gmask = amask = want
        for i, (block, on_gpu) in enumerate(zip(chain, map(gpu_get, chain, itertools.repeat(0)), strict=False)):
            held = on_gpu & gmask
            if held != gmask:
                _stopped(gmask ^ held, i, gpu_len)
                gmask = held
            held = (on_gpu | storage_get(block, 0)) & amask
            if held != amask:
                _stopped(amask ^ held, i, any_len)
                amask = held
                if not amask:  # GPU-held implies held, so gmask is empty too
                    break
        return gpu_len, any_len

    async def match_many(self, queries: Sequence[MatchQuery]) -> list[dict[str, BlockMatch]]:
        return [self.match_nowait(q.chain, q.backends) for q in queries]

    # ---- write side ------------------------------------------------------------------------

    async def apply_batches(self, batches: Sequence[KvBatch]) -> BlockApplyReport:
        return self.apply_nowait(batches)

    def apply_nowait(self, batches: Sequence[KvBatch]) -> BlockApplyReport:
        report = BlockApplyReport()
        for batch in batches:
            one = BlockApplyReport()
            backend = self._backend_for(batch, one)
            if backend is not None:
                self._apply_events(backend, batch, one)
            report.merge(one)
            known = self._backends.get(batch.backend)
            if known is not None:
                known.totals.merge(one)
        return report

    def _backend_for(self, batch: KvBatch, report: BlockApplyReport) -> _Backend | None:
        """The backend's state to apply `batch` to, or None when the batch is stale (an older
        epoch). A newer epoch, or the first batch after expiry, starts from a wiped state."""
        now = self._clock()
        backend = self._live(batch.backend, now)
        if not seq_in_range(batch) or (backend is not None and batch.source_epoch < backend.epoch):
            report.stale_batches += 1
            report.stale += batch.block_count
            return None
        if backend is None:
            tiers = self._spare_registers(now)
            backend = _Backend(self._take_bit(), batch.source_epoch, next(self._generations), now, tiers)
            self._backends[batch.backend] = backend
            if not (batch.events and isinstance(batch.events[0], AllCleared)):
                report.gaps.add(batch.backend)  # history missing: see BlockApplyReport.gaps
        elif batch.source_epoch > backend.epoch:
            self._wipe(backend)
            backend.epoch = batch.source_epoch
            backend.watermark = backend.tmax = -1
            backend.generation = next(self._generations)
        backend.last_batch = now
        if now - backend.rotated_at >= self.tombstone_seconds or self._tombstones_over_cap(backend):
            self._rotate(backend, now)
        report.batches += 1
        return backend

    def _apply_events(self, backend: _Backend, batch: KvBatch, report: BlockApplyReport) -> None:
        for index, event in enumerate(batch.events):
            st = stamp(batch.seq, index)
            if isinstance(event, AllCleared):
                self._clear(backend, st, report)
            elif st <= backend.watermark:
                report.stale += len(event.hashes)
            elif isinstance(event, BlocksStored):
                self._store(backend, event.tier, event.hashes, st, report)
            else:
                self._remove(backend, event.tier, event.hashes, st, report)

    def _store(self, backend: _Backend, t: int, hashes: Sequence[int], st: int, report: BlockApplyReport) -> None:
        tier = backend.tiers[t]
        present, owners, bit = tier.present, self._owners[t], backend.bit
        check = st <= backend.tmax
        applied = 0
        for block in hashes:
            old = present.get(block)
            if old is not None:
                # present: its stamp is the newest record of the block (a removal deletes it)
                if old >= st:
                    continue
                present[block] = st
                present.move_to_end(block)
            else:
                if check and tier.tomb(block) >= st:
                    continue
                present[block] = st
                owners[block] = owners.get(block, 0) | bit
            applied += 1
        report.applied += applied
        report.stale += len(hashes) - applied
        over = len(present) - self.max_blocks
        if over > 0:
            report.evicted += over
            for _ in range(over):
                block, old = present.popitem(last=False)
                self._unown(owners, block, bit)
                tier.tombs[block] = old  # an evicted block's store stays stale if redelivered
                backend.tmax = max(backend.tmax, old)

    def _remove(self, backend: _Backend, t: int, hashes: Sequence[int], st: int, report: BlockApplyReport) -> None:
        tier = backend.tiers[t]
        present, owners, bit = tier.present, self._owners[t], backend.bit
        applied = 0
        for block in hashes:
            old = present.get(block)
            if old is not None:
                if old >= st:
                    continue
                del present[block]
                self._unown(owners, block, bit)
            elif tier.tomb(block) >= st:
                continue
            tier.tombs[block] = st
            applied += 1
        if applied and st > backend.tmax:
            backend.tmax = st
        report.applied += applied
        report.stale += len(hashes) - applied

    def _clear(self, backend: _Backend, st: int, report: BlockApplyReport) -> None:
        if st <= backend.watermark:
            return
        backend.watermark = st
        for t, tier in enumerate(backend.tiers):
            gone = [block for block, old in tier.present.items() if old <= st]
            owners = self._owners[t]
            for block in gone:
                del tier.present[block]
                self._unown(owners, block, backend.bit)
        backend.generation = next(self._generations)
        report.clears += 1

    # ---- backends --------------------------------------------------------------------------

    def _live(self, name: str, now: float) -> _Backend | None:
        """The backend's state, or None (dropping it) when its last batch is older than the TTL."""
        backend = self._backends.get(name)
        if backend is not None and now - backend.last_batch >= self.ttl:
            self._drop(name)
            return None
        return backend

    def _drop(self, name: str) -> int:
        backend = self._backends.pop(name)
        held = self._wipe(backend)
        self._free_bits.append(backend.bit)
        self._spare_tiers.append(backend.tiers)
        return held

    def _wipe(self, backend: _Backend) -> int:
        """Forget the backend's registers (present blocks and tombstones); return how many
        present blocks went."""
        held = 0
        for t, tier in enumerate(backend.tiers):
            owners = self._owners[t]
            for block in tier.present:
                self._unown(owners, block, backend.bit)
            held += len(tier.present)
            tier.clear()  # in place: see reserve()
        return held

    def _spare_registers(self, now: float) -> tuple[_Tier, _Tier]:
        """Registers for a backend new to the index: spare ones (reserve), else those of a
        backend expired and not yet dropped, else new ones."""
        if not self._spare_tiers:
            for name in [n for n, b in self._backends.items() if now - b.last_batch >= self.ttl]:
                self._drop(name)
        return self._spare_tiers.pop() if self._spare_tiers else (_Tier(), _Tier())

    def _take_bit(self) -> int:
        if self._free_bits:
            return self._free_bits.pop()
        bit = 1 << self._next_bit
        self._next_bit += 1
        return bit

    @staticmethod
    def _unown(owners: dict[int, int], block: int, bit: int) -> None:
        mask = owners.get(block, 0) & ~bit
        if mask:
            owners[block] = mask
        else:
            owners.pop(block, None)

    def _tombstones_over_cap(self, backend: _Backend) -> bool:
        return sum(len(tier.tombs) for tier in backend.tiers) > 2 * self.max_blocks

    @staticmethod
    def _rotate(backend: _Backend, now: float) -> int:
        dropped = 0
        for tier in backend.tiers:
            dropped += len(tier.old_tombs)
            tier.old_tombs, tier.tombs = tier.tombs, {}
        backend.rotated_at = now
        return dropped

    # ---- administration --------------------------------------------------------------------

    async def cleanup(self) -> int:
        """Drop expired backends and tombstones older than their window; return how many
        entries (present blocks and tombstones) went."""
        now = self._clock()
        dropped = 0
        for name, backend in list(self._backends.items()):
            if now - backend.last_batch >= self.ttl:
                dropped += self._drop(name)
            elif now - backend.rotated_at >= self.tombstone_seconds:
                dropped += self._rotate(backend, now)
        return dropped

    async def block_stats(self) -> BlockIndexStats:
        return self.stats_nowait()

    def stats_nowait(self) -> BlockIndexStats:
        now = self._clock()
        out: dict[str, BlockBackendStats] = {}
        for name in sorted(self._backends):
            backend = self._live(name, now)
            if backend is None:
                continue
            t = backend.totals
            out[name] = BlockBackendStats(
                gpu_blocks=len(backend.tiers[_GPU].present),
                storage_blocks=len(backend.tiers[_STORAGE].present),
                source_epoch=backend.epoch,
                last_batch_age_s=max(0.0, now - backend.last_batch),
                generation=backend.generation,
                batches=t.batches,
                applied=t.applied,
                stale=t.stale,
                stale_batches=t.stale_batches,
                clears=t.clears,
                evicted=t.evicted,
            )
        return BlockIndexStats(out)

    async def clear_blocks(self) -> int:
        return sum(self._drop(name) for name in list(self._backends))

    async def close(self) -> None:
        return None
