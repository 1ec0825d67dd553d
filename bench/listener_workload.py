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
