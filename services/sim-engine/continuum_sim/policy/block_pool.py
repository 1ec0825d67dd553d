"""The prefix-cache block pool, with vLLM v1 semantics (`vllm/v1/core/block_pool.py`).

* Block 0 is the null block and never allocated; capacity is `num_blocks - 1` blocks.
* Free blocks sit in an LRU queue. Allocation pops from the head; a popped block that still
  carries a hash is evicted then (one `RemovedEvent` per block), so cached blocks stay reusable
  until their slot is actually needed.
* A request frees its blocks in reverse order, so its tail blocks are evicted first.
* A prefix hit (`touch`) takes a free cached block out of the queue; blocks referenced by a
  running request are never evicted.
* Caching a newly full block registers its hash (several blocks may share one hash, as in vLLM)
  and emits one `StoredEvent` per call with the blocks' hashes, parent and tokens.
* `reset()` clears every hash and emits `ClearedEvent`, and refuses while blocks are in use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Literal

from continuum_sim.protocol.block_hash import block_extra_keys, sglang_page_digest
from continuum_sim.protocol.kv_wire import ClearedEvent, KvEvent, RemovedEvent, StoredEvent

EventHash = Literal["vllm", "sglang"]


class NoFreeBlocks(Exception):
    """Internal signal: an allocation asked for more blocks than the free queue holds."""


class KVBlock:
    __slots__ = ("block_hash", "block_id", "event_digest", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None  # vLLM digest: the cache key
        self.event_digest: bytes | None = None  # what events announce (vLLM or SGLang digest)

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        events_enabled: bool = True,
        event_hash: EventHash = "vllm",
    ) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is the null block)")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.events_enabled = events_enabled
        self.event_hash: EventHash = event_hash
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self._cached: dict[bytes, dict[int, KVBlock]] = {}
        self._events: list[KvEvent] = []

    # -- state ----------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(v) for v in self._cached.values())

    @property
    def num_cached_hashes(self) -> int:
        """Distinct hashes in the prefix cache (a hash may sit in several blocks)."""
        return len(self._cached)

    def usage(self) -> float:
        """vLLM's `kv_cache_usage_perc`: the share of blocks referenced by requests."""
        return 1.0 - self.num_free_blocks / self.capacity

    def is_cached(self, block_hash: bytes) -> bool:
        return block_hash in self._cached

    def free_queue_ids(self) -> list[int]:
        """Block ids in eviction order (head first); for tests and debugging."""
        return list(self._free)

    def take_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    # -- lookups and reference counting -----------------------------------------------------

    def longest_cached_prefix(self, hashes: Sequence[bytes]) -> list[KVBlock]:
        """The cached blocks of the longest prefix of `hashes` (stops at the first miss)."""
        hit: list[KVBlock] = []
        cached = self._cached
        for block_hash in hashes:
            blocks = cached.get(block_hash)
            if not blocks:
                break
            hit.append(next(iter(blocks.values())))
        return hit

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def allocate(self, count: int) -> list[KVBlock]:
        if count > len(self._free):
            raise NoFreeBlocks(count)
        out: list[KVBlock] = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            self._maybe_evict(block)
            block.ref_cnt += 1
            out.append(block)
        return out

    def free(self, blocks_in_eviction_order: Iterable[KVBlock]) -> None:
        for block in blocks_in_eviction_order:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and block is not self.null_block:
                self._free[block.block_id] = block

    def _maybe_evict(self, block: KVBlock) -> None:
        block_hash = block.block_hash
        if block_hash is None:
            return
        owners = self._cached.get(block_hash)
        if owners is None or owners.pop(block.block_id, None) is None:
            return
        if not owners:
            del self._cached[block_hash]
        digest = block.event_digest
        block.block_hash = None
        block.event_digest = None
        if self.events_enabled and digest is not None:
            self._events.append(RemovedEvent((digest,)))

    # -- caching ----------------------------------------------------------------------------

    def cache_full_blocks(
        self,
        blocks: Sequence[KVBlock],
        block_hashes: Sequence[bytes],
        all_token_ids: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        *,
        cache_salt: str | None,
    ) -> None:
        """Register blocks [num_cached_blocks, num_full_blocks) of one request as cached."""
        if not self.enable_caching or num_full_blocks <= num_cached_blocks:
            return
        size = self.block_size
        prior = blocks[num_cached_blocks - 1].event_digest if num_cached_blocks > 0 else None
        parent = prior
        digests: list[bytes] = []
        for index in range(num_cached_blocks, num_full_blocks):
            block = blocks[index]
            block_hash = block_hashes[index]
            block.block_hash = block_hash
            if self.event_hash == "sglang":
                prior = sglang_page_digest(prior, all_token_ids[index * size : (index + 1) * size])
                block.event_digest = prior
            else:
                block.event_digest = block_hash
            self._cached.setdefault(block_hash, {})[block.block_id] = block
            digests.append(block.event_digest)
        if self.events_enabled:
            lo, hi = num_cached_blocks * size, num_full_blocks * size
            self._events.append(
                StoredEvent(
                    digests=tuple(digests),
                    parent=parent,
                    token_ids=tuple(all_token_ids[lo:hi]),
                    block_size=size,
                    extra_keys=tuple(
                        block_extra_keys(i, cache_salt) for i in range(num_cached_blocks, num_full_blocks)
                    ),
                )
            )

    def reset(self) -> bool:
        """vLLM's `reset_prefix_cache`: only when no request holds a block."""
        if self.num_free_blocks != self.capacity:
            return False
        self._cached.clear()
        for block in self.blocks:
            block.block_hash = None
            block.event_digest = None
        if self.events_enabled:
            self._events.append(ClearedEvent())
        return True
