"""Test helpers for the KV index: realistic per-backend event streams and a naive in-order
model of the index, written from the rules in docs/kv-index.md without sharing any code with
continuum_common.kvindex (so the two can disagree)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

from continuum_common.events import EventType, KvEvent, Tier
from continuum_common.kvindex import KvHolder, TierPolicy


def prefix(i: int) -> str:
    return hashlib.sha256(f"prefix-{i}".encode()).hexdigest()


def make_stream(
    rng: random.Random,
    *,
    backends: Iterable[str],
    prefixes: int,
    count: int,
    clears: bool = True,
    epochs: bool = True,
) -> list[KvEvent]:
    """`count` events interleaved over backends, each backend's in (epoch, seq) order, with
    realistic types (created/updated/evicted/offloaded on both tiers, occasional `cleared` and
    listener restarts that start a new epoch). Token counts are always > 0."""
    names = list(backends)
    position = {b: [1, 0] for b in names}  # epoch, seq
    out: list[KvEvent] = []
    for _ in range(count):
        backend = rng.choice(names)
        epoch_seq = position[backend]
        if epochs and rng.random() < 0.01:
            epoch_seq[0] += 1
            epoch_seq[1] = 0
        epoch_seq[1] += 1
        roll = rng.random()
        p: str | None = prefix(rng.randrange(prefixes))
        tier = Tier.STORAGE_WARM if rng.random() < 0.25 else Tier.GPU_HOT
        tokens = rng.choice((16, 256, 512, 1024, 2048, 4096))
        if clears and roll < 0.02:
            etype, p = EventType.CLEARED, None
        elif roll < 0.5:
            etype = EventType.CREATED
        elif roll < 0.7:
            etype = EventType.UPDATED
        elif roll < 0.9:
            etype = EventType.EVICTED
        else:
            etype = EventType.OFFLOADED
        out.append(KvEvent(backend, epoch_seq[0], epoch_seq[1], 1.0, etype, p, tokens, tier))
    return out


class NaiveIndex:
    """In-order, exactly-once application of the documented rules: the reference result."""

    def __init__(self, policy: TierPolicy) -> None:
        self.policy = policy
        self.gpu: dict[tuple[str, str], int] = {}
        self.warm: dict[tuple[str, str], int] = {}

    def apply(self, e: KvEvent) -> None:
        track, offload = self.policy.track_tiers, self.policy.evict_as_offload
        if e.type is EventType.CLEARED:
            for table in (self.gpu, self.warm):
                for key in [k for k in table if k[1] == e.backend]:
                    del table[key]
            return
        assert e.prefix_hash is not None
        key = (e.prefix_hash, e.backend)
        if e.type in (EventType.CREATED, EventType.UPDATED):
            if e.tier is Tier.GPU_HOT:
                self.gpu[key] = e.token_count
            elif track:
                self.warm[key] = e.token_count
        elif e.type is EventType.OFFLOADED or (e.type is EventType.EVICTED and e.tier is Tier.GPU_HOT):
            moved = e.type is EventType.OFFLOADED or offload
            self.gpu.pop(key, None)
            if track and moved:
                self.warm[key] = e.token_count
        elif e.type is EventType.EVICTED and track:
            self.warm.pop(key, None)

    def snapshot(self, indices: Iterable[int]) -> dict[str, list[KvHolder]]:
        out: dict[str, list[KvHolder]] = {}
        for i in indices:
            p = prefix(i)
            held = []
            for backend in sorted({b for (q, b) in [*self.gpu, *self.warm] if q == p}):
                if (p, backend) in self.gpu:
                    held.append(KvHolder(backend, self.gpu[(p, backend)], Tier.GPU_HOT))
                elif (p, backend) in self.warm:
                    held.append(KvHolder(backend, self.warm[(p, backend)], Tier.STORAGE_WARM))
            held.sort(key=lambda h: (-h.token_count, h.backend))
            out[p] = held
        return out
