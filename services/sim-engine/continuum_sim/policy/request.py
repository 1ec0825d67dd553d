"""One generation request as the scheduler sees it."""

from __future__ import annotations

import enum
from collections.abc import Sequence

from continuum_sim.policy.block_pool import KVBlock
from continuum_sim.protocol.block_hash import chain_hashes


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class SimRequest:
    """Prompt, the pre-drawn output tokens, and the request's KV state.

    The output is fixed at submission (`output_plan`), so the tokens a decode step feeds into the
    KV cache are known before they are "emitted" — which lets one simulated step stand for
    several decode iterations at high time compression.
    """

    __slots__ = (
        "_hash_root",
        "aborted",
        "all_token_ids",
        "arrival_time",
        "block_hashes",
        "block_size",
        "blocks",
        "cache_salt",
        "finish_reason",
        "first_token_time",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_prompt_tokens",
        "request_id",
        "status",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        output_plan: Sequence[int],
        *,
        block_size: int,
        hash_root: bytes,
        cache_salt: str | None = None,
        finish_reason: str = "length",
        arrival_time: float = 0.0,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        if not output_plan:
            raise ValueError("a request must generate at least one token")
        self.request_id = request_id
        self.num_prompt_tokens = len(prompt_token_ids)
        self.all_token_ids: list[int] = [*prompt_token_ids, *output_plan]
        self.block_size = block_size
        self.cache_salt = cache_salt
        self.finish_reason = finish_reason
        self.arrival_time = arrival_time
        self.first_token_time: float | None = None
        self.status = RequestStatus.WAITING
        self.aborted = False
        self.num_output = 0
        self.num_computed = 0
        self.num_cached_tokens = -1  # set once, at first scheduling (vLLM's num_cached_tokens)
        self.num_preemptions = 0
        self.blocks: list[KVBlock] = []
        self.num_cached_blocks = 0
        self.block_hashes: list[bytes] = []
        self._hash_root = hash_root

    @property
    def max_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus the output emitted so far."""
        return self.num_prompt_tokens + self.num_output

    @property
    def is_decoding(self) -> bool:
        return self.num_output > 0 and self.num_computed == self.num_tokens - 1

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens : self.num_tokens]

    def ensure_block_hashes(self, num_blocks: int) -> list[bytes]:
        """Hashes of the first `num_blocks` full blocks (computed lazily, once)."""
        have = len(self.block_hashes)
        if num_blocks > have:
            end = num_blocks * self.block_size
            parent = self.block_hashes[-1] if have else None
            self.block_hashes += chain_hashes(
                self.all_token_ids[:end],
                self.block_size,
                self._hash_root,
                cache_salt=self.cache_salt,
                start=have,
                parent=parent,
            )
        return self.block_hashes

    def emit(self, count: int) -> list[int]:
        """Mark the next `count` planned tokens as generated and return them."""
        start = self.num_tokens
        count = min(count, len(self.all_token_ids) - start)
        self.num_output += count
        return self.all_token_ids[start : start + count]

    @property
    def done(self) -> bool:
        return self.num_tokens >= len(self.all_token_ids)
