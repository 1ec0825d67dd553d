"""Test helpers for the block index: realistic per-backend KvBatch streams and a naive model
that applies them in order, exactly once, written from the rules in
continuum_common.kvindex.blocks without sharing any code with the index (so the two can
disagree)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from continuum_common.kvindex import BlockMatch, MatchQuery
from continuum_common.wire.kv import AllCleared, BlockEvent, BlocksRemoved, BlocksStored, KvBatch

# Hashes that exercise the whole u64 range (the top bit, zero, the maximum).
SPECIAL_HASHES = (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)


def universe(size: int, seed: int = 11) -> list[int]:
    rng = random.Random(seed)
    out = list(SPECIAL_HASHES)
    while len(out) < size:
        out.append(rng.getrandbits(64))
    return out[:size]


def batch(backend: str, seq: int, *events: BlockEvent, epoch: int = 1, ts: float = 0.0) -> KvBatch:
    return KvBatch(backend, epoch, seq, ts, list(events))


def make_batches(
    rng: random.Random,
    *,
    backends: Iterable[str],
    hashes: Sequence[int],
    count: int,
    tiers: bool = True,
    epochs: bool = True,
) -> list[KvBatch]:
    """`count` batches interleaved over backends, each backend's in (epoch, seq) order. Every
    epoch starts with AllCleared; then stores of chains (2-8 hashes, sometimes on the storage
    tier), single-hash removals, the odd mid-epoch AllCleared, keepalives."""
    position = {b: [1, 0] for b in backends}
    names = list(position)
    out: list[KvBatch] = []
    for _ in range(count):
        backend = rng.choice(names)
        epoch_seq = position[backend]
        if epochs and epoch_seq[1] > 0 and rng.random() < 0.03:
            epoch_seq[0] += 1
            epoch_seq[1] = 0
        epoch_seq[1] += 1
        events: list[BlockEvent] = [AllCleared()] if epoch_seq[1] == 1 else []
        for _ in range(rng.choice((0, 1, 2, 3, 4))):
            roll = rng.random()
            tier = 1 if tiers and rng.random() < 0.25 else 0
            if roll < 0.5:
                start = rng.randrange(len(hashes))
                events.append(BlocksStored(list(hashes[start : start + rng.randint(2, 8)]), tier=tier))
            elif roll < 0.97:
                events.append(BlocksRemoved([rng.choice(hashes)], tier=tier))
            else:
                events.append(AllCleared())
        out.append(batch(backend, epoch_seq[1], *events, epoch=epoch_seq[0]))
    return out


@dataclass
class _State:
    epoch: int
    gpu: set[int] = field(default_factory=set)
    storage: set[int] = field(default_factory=set)


class NaiveBlocks:
    """In-order, exactly-once application: the reference result."""

    def __init__(self) -> None:
        self.state: dict[str, _State] = {}

    def apply_in_order(self, batches: Iterable[KvBatch]) -> None:
        unique = {(b.backend, b.source_epoch, b.seq): b for b in batches}
        for key in sorted(unique):
            self.apply(unique[key])

    def apply(self, b: KvBatch) -> None:
        state = self.state.get(b.backend)
        if state is None or b.source_epoch > state.epoch:
            state = self.state[b.backend] = _State(b.source_epoch)
        elif b.source_epoch < state.epoch:
            return
        for event in b.events:
            if isinstance(event, AllCleared):
                state.gpu.clear()
                state.storage.clear()
                continue
            tier = state.gpu if event.tier == 0 else state.storage
            if isinstance(event, BlocksStored):
                tier.update(event.hashes)
            else:
                tier.difference_update(event.hashes)

    def match(self, chain: Sequence[int], backend: str) -> tuple[int, int, int]:
        """(gpu_blocks, any_blocks, held_blocks) as the index should report them."""
        state = self.state.get(backend)
        if state is None:
            return 0, 0, 0
        gpu = 0
        while gpu < len(chain) and chain[gpu] in state.gpu:
            gpu += 1
        held = 0
        while held < len(chain) and (chain[held] in state.gpu or chain[held] in state.storage):
            held += 1
        return gpu, held, len(state.gpu)


def without_generation(matches: dict[str, BlockMatch]) -> dict[str, tuple[int, int, int]]:
    return {b: (m.gpu_blocks, m.any_blocks, m.held_blocks) for b, m in matches.items()}


def probe_chains(hashes: Sequence[int]) -> list[list[int]]:
    """Every single block, and overlapping chains in universe order (the leading-run rule)."""
    return [[h] for h in hashes] + [list(hashes[i : i + 6]) for i in range(0, len(hashes), 3)]


def expected_matches(naive: NaiveBlocks, hashes: Sequence[int], backends: Sequence[str]) -> list[dict[str, Any]]:
    return [{b: naive.match(chain, b) for b in backends} for chain in probe_chains(hashes)]


async def read_matches(index: Any, hashes: Sequence[int], backends: Sequence[str]) -> list[dict[str, Any]]:
    results = await index.match_many([MatchQuery(chain, backends) for chain in probe_chains(hashes)])
    return [without_generation(r) for r in results]
