"""Per-request KV allocation over the block pool (vLLM's `KVCacheManager`, one full-attention group).

Rules kept from vLLM:
* a prefix hit covers whole blocks only, and never the last prompt token (at least one token is
  always recomputed, so a 32-token prompt fully cached with block size 16 hits 16 tokens);
* blocks are cached (and announced) when they are scheduled, so a request admitted later in the
  same step already hits them;
* allocation fails without side effects when the free queue is too short (the scheduler then
  preempts or stops admitting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from continuum_sim.policy.block_pool import BlockPool, KVBlock
from continuum_sim.policy.request import SimRequest


@dataclass
class PrefixCacheStats:
    """Cumulative counters behind `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` (tokens)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0


class KVCacheManager:
    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.stats = PrefixCacheStats()

    def get_computed_blocks(self, request: SimRequest) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of `request` (blocks, tokens), capped at num_tokens - 1."""
        if not self.pool.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return [], 0
        hashes = request.ensure_block_hashes(max_blocks)[:max_blocks]
        hit = self.pool.longest_cached_prefix(hashes)
        return hit, len(hit) * self.block_size

    def record_query(self, request: SimRequest, hit_tokens: int) -> None:
        self.stats.requests += 1
        self.stats.queries += request.num_tokens
        self.stats.hits += hit_tokens

    def allocate_slots(
        self, request: SimRequest, num_new_tokens: int, new_computed_blocks: Sequence[KVBlock] = ()
    ) -> bool:
        """Reserve blocks for `num_new_tokens` more tokens (after any prefix-hit blocks) and cache
        the blocks that become full. False, with nothing changed, when blocks are short."""
        bs = self.block_size
        computed_tokens = request.num_computed + len(new_computed_blocks) * bs
        total_tokens = computed_tokens + num_new_tokens
        needed = -(-total_tokens // bs) - len(request.blocks) - len(new_computed_blocks)
        # Prefix-hit blocks that sit in the free queue leave it when touched.
        reclaimed = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if max(needed, 0) > self.pool.num_free_blocks - reclaimed:
            return False
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
            request.blocks.extend(new_computed_blocks)
            request.num_cached_blocks = len(request.blocks)
        if needed > 0:
            request.blocks.extend(self.pool.allocate(needed))
        self.cache_blocks(request, min(total_tokens, len(request.all_token_ids)))
        return True

    def cache_blocks(self, request: SimRequest, num_tokens: int) -> None:
        num_full = num_tokens // self.block_size
        if not self.pool.enable_caching or request.num_cached_blocks >= num_full:
            return
        hashes = request.ensure_block_hashes(num_full)
        self.pool.cache_full_blocks(
            request.blocks,
            hashes,
            request.all_token_ids,
            request.num_cached_blocks,
            num_full,
            cache_salt=request.cache_salt,
        )
        request.num_cached_blocks = num_full

    def free(self, request: SimRequest) -> None:
        """Release the request's blocks, tail first (vLLM frees in reverse order)."""
        self.pool.free(reversed(request.blocks))
        request.blocks = []
        request.num_cached_blocks = 0
