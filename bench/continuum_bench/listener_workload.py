"""Synthetic vLLM KV-event traffic for the listener benchmarks.

Map-encoded batches (vLLM ≥ 2026-06 wire format, see kv-events-spec §1.3) from a simulated
engine with `prefixes` distinct system prompts: new requests store a salted prefill chain,
running requests extend their chain one block per decode step, and the cache evicts single
blocks (vLLM's GPU eviction publishes one hash per BlockRemoved). Deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from continuum_common.salt import make_salt


@dataclass
class Mix:
    new_request: float = 0.15
    extend: float = 0.55  # the rest evicts one block


@dataclass
class Workload:
    secret: bytes
    backend: str
    prefixes: int = 256
    block_size: int = 16
    seed: int = 1
    salted: bool = True
    mix: Mix = field(default_factory=Mix)
    max_live: int = 200_000  # the simulated engine's cache capacity in blocks
    block_events: int = 0  # hashes stored + removed so far

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.salts = [make_salt(self.secret, self.backend, self.rng.randbytes(32)) for _ in range(self.prefixes)]
        self.tokens = [self.rng.randrange(150_000) for _ in range(self.block_size * 64)]
        self.tails: list[int] = []
        self.live: list[int] = []

    def _hash(self) -> int:
        return self.rng.getrandbits(64)

    def _tokens(self, blocks: int) -> list[int]:
        start = self.rng.randrange(len(self.tokens) - self.block_size * blocks + 1)
        return self.tokens[start : start + self.block_size * blocks]

    def event(self) -> dict[str, Any]:
        roll = self.rng.random()
        if roll < self.mix.new_request or not self.tails:
            n = self.rng.randint(4, 16)
            hashes = [self._hash() for _ in range(n)]
            salt = self.rng.choice(self.salts) if self.salted else None
            extra = [[salt] if salt else None] + [None] * (n - 1)
            self.tails.append(hashes[-1])
            if len(self.tails) > 512:
                self.tails.pop(self.rng.randrange(len(self.tails)))
            self.live.extend(hashes)
            self._trim()
            self.block_events += n
            return _stored(hashes, None, self._tokens(n), self.block_size, extra)
        if roll < self.mix.new_request + self.mix.extend:
            index = self.rng.randrange(len(self.tails))
            parent, child = self.tails[index], self._hash()
            self.tails[index] = child
            self.live.append(child)
            self._trim()
            self.block_events += 1
            return _stored([child], parent, self._tokens(1), self.block_size, None)
        if not self.live:
            return self.event()
        index = self.rng.randrange(len(self.live))
        self.live[index], self.live[-1] = self.live[-1], self.live[index]
        victim = self.live.pop()
        self.block_events += 1
        return {"type": "BlockRemoved", "block_hashes": [victim], "medium": "GPU", "group_idx": 0}

    def _trim(self) -> None:
        """Forget blocks beyond the engine's capacity (their removal is never announced, as when
        events are lost: the listener's own limits must cope)."""
        while len(self.live) > self.max_live:
            index = self.rng.randrange(len(self.live))
            self.live[index] = self.live[-1]
            self.live.pop()

    def batches(self, count: int, events_per_batch: int = 8) -> Iterator[bytes]:
        for i in range(count):
            events = [self.event() for _ in range(events_per_batch)]
            yield msgpack.packb([1767225600.0 + i, events, 0])


def _stored(hashes: list[int], parent: int | None, tokens: list[int], size: int, extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    if extra is not None:
        event["extra_keys"] = extra
    return event


@dataclass
class BlockTraffic:
    """vLLM-shaped batches for block mode: each engine step stores one request's new full blocks
    (`min_blocks`–`max_blocks` hashes in one BlockStored: a new prompt, or the next turn of a
    running conversation chained on its tail) and, once the simulated cache holds `capacity`
    blocks, evicts as many as it stored, one hash per BlockRemoved (vLLM's GPU eviction).
    Map-encoded events (vLLM ≥ 2026-06). Deterministic for a seed."""

    seed: int = 1
    block_size: int = 16
    min_blocks: int = 20
    max_blocks: int = 200
    capacity: int = 50_000
    continue_share: float = 0.5
    block_events: int = 0  # hashes stored + removed so far
    stored: int = 0
    removed: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.tokens = [self.rng.randrange(150_000) for _ in range(self.block_size * self.max_blocks * 2)]
        self.tails: list[int] = []
        self.live: list[int] = []

    def step(self) -> list[dict[str, Any]]:
        rng = self.rng
        n = rng.randint(self.min_blocks, self.max_blocks)
        parent = None
        if self.tails and rng.random() < self.continue_share:
            index = rng.randrange(len(self.tails))
            parent = self.tails[index]
        else:
            index = -1
        hashes = [rng.getrandbits(64) for _ in range(n)]
        if index >= 0:
            self.tails[index] = hashes[-1]
        else:
            self.tails.append(hashes[-1])
            if len(self.tails) > 1024:
                self.tails.pop(rng.randrange(len(self.tails)))
        start = rng.randrange(len(self.tokens) - self.block_size * n + 1)
        events = [_stored(hashes, parent, self.tokens[start : start + self.block_size * n], self.block_size, None)]
        self.live.extend(hashes)
        self.stored += n
        while len(self.live) > self.capacity:
            victim = rng.randrange(len(self.live))
            self.live[victim], self.live[-1] = self.live[-1], self.live[victim]
            events.append({"type": "BlockRemoved", "block_hashes": [self.live.pop()], "medium": "GPU", "group_idx": 0})
            self.removed += 1
        self.block_events = self.stored + self.removed
        return events

    def batches(self, count: int) -> Iterator[bytes]:
        for i in range(count):
            yield msgpack.packb([1767225600.0 + i, self.step(), 0])
