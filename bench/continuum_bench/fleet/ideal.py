"""The ideal prefix-cache hit rate of a workload: one pooled LRU cache with the fleet's capacity.

Requests are processed in the order the driver sent them. For each request:

1. hit = the longest run of leading full blocks of its prompt that are in the pool, capped like
   vLLM at (prompt_tokens - 1) // block_size blocks; hit tokens = blocks x block_size;
2. the prompt's full blocks are then inserted (or refreshed) as most recently used;
3. when the request completes, the full blocks of prompt + answer (all but the last generated
   token, whose KV is never computed) are inserted too, as the engine caches decoded tokens;
4. beyond the capacity (the sum of the engines' usable blocks) the least recently used block goes.

ideal = sum(hit tokens) / sum(prompt tokens). This is what a router with perfect knowledge
would get if the fleet's KV memory were one cache: every request reuses the longest prefix seen
before that is still held. A real fleet stores popular prefixes on several engines and cannot
share blocks between engines, so it normally stays below this figure; LRU is not an optimal
replacement policy either, so the figure is a reference for "attainable", not a strict bound.
`unbounded` is the same computation with infinite capacity (the workload's inherent reuse).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_keys(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained keys of the full blocks (equal prefixes give equal keys; 64-bit tuple hashes —
    int tuples hash the same in every process, and a collision only skews a statistic)."""
    keys: list[int] = []
    parent = 0
    for lo in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[lo : lo + block_size])))
        keys.append(parent)
    return keys


class IdealCache:
    def __init__(self, capacity_blocks: int | None, block_size: int) -> None:
        self.capacity = capacity_blocks
        self.block_size = block_size
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.prompt_tokens = 0
        self.hit_tokens = 0

    def on_send(self, prompt_ids: Sequence[int]) -> int:
        """Account a request's prompt; returns its ideal hit in tokens."""
        keys = block_keys(prompt_ids, self.block_size)
        limit = (len(prompt_ids) - 1) // self.block_size
        hit = 0
        for key in keys[:limit]:
            if key not in self._lru:
                break
            hit += 1
        self.prompt_tokens += len(prompt_ids)
        self.hit_tokens += hit * self.block_size
        self._insert(keys)
        return hit * self.block_size

    def on_complete(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        if output_ids:
            self._insert(block_keys([*prompt_ids, *output_ids[:-1]], self.block_size))

    def _insert(self, keys: Sequence[int]) -> None:
        lru = self._lru
        # Tail first, so a prefix's head blocks are the most recently used and go last (vLLM
        # frees a request's blocks tail first for the same reason).
        for key in reversed(keys):
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
        if self.capacity is not None:
            while len(lru) > self.capacity:
                lru.popitem(last=False)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
