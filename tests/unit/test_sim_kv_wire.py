"""The simulator's KV-event payloads are byte-identical to the engines' own fixtures.

The block pool is driven through the fixture scenario (README "Scenario and hash inputs"): one
request with blocks T1, T2, T3 (two blocks cached in one step, the third in the next), the
eviction of block 3, then a cache reset.
"""

from __future__ import annotations

import msgpack
import pytest

from continuum_sim.policy.block_pool import BlockPool
from continuum_sim.policy.kv_manager import KVCacheManager
from continuum_sim.policy.request import SimRequest
from continuum_sim.protocol.block_hash import none_hash
from continuum_sim.protocol.kv_wire import (
    END_SEQ,
    BatchEncoder,
    KvEvent,
    RemovedEvent,
    replay_end_frames,
    replay_reply_frames,
)
from continuum_testing.sim_fixtures import ERA_DIRS, FIXTURE_TS, T1, T2, T3, fixture_bytes


def fixture_scenario(event_hash: str = "vllm") -> list[list[KvEvent]]:
    """Events of the scenario, grouped as the fixtures group them: stored, removed, cleared."""
    pool = BlockPool(5, 16, event_hash=event_hash)  # null block + 4
    kv = KVCacheManager(pool)
    request = SimRequest("r", [*T1, *T2, *T3, 7], [9], block_size=16, hash_root=none_hash("0"))
    assert kv.allocate_slots(request, 32)  # chunk 1: blocks 1-2 become full
    request.num_computed = 32
    assert kv.allocate_slots(request, 17)  # chunk 2: block 3 full, block 4 partial
    stored = pool.take_events()
    kv.free(request)  # tail first: the partial block, then block 3 are next to go
    taken = pool.allocate(2)  # another request's 2 blocks: evicts the hashless one, then block 3
    removed = pool.take_events()
    assert not pool.reset(), "reset must be refused while a request holds blocks"
    pool.free(taken)
    assert pool.reset()
    cleared = pool.take_events()
    return [stored, removed, cleared]


@pytest.mark.parametrize("era", ["array", "map"])
@pytest.mark.parametrize("variant", ["", "_byteshash"])
def test_vllm_eras_match_fixtures_byte_for_byte(era: str, variant: str) -> None:
    stored, removed, cleared = fixture_scenario()
    assert [type(e).__name__ for e in stored + removed + cleared] == [
        "StoredEvent", "StoredEvent", "RemovedEvent", "ClearedEvent",
    ]  # fmt: skip
    encoder = BatchEncoder(era, "bytes" if variant else "int")  # type: ignore[arg-type]
    base = ERA_DIRS[era]
    assert encoder.encode(FIXTURE_TS, stored) == fixture_bytes(f"{base}/batch_stored{variant}.msgpack")
    assert encoder.encode(FIXTURE_TS, removed) == fixture_bytes(f"{base}/batch_removed{variant}.msgpack")
    if not variant:
        assert encoder.encode(FIXTURE_TS, cleared) == fixture_bytes(f"{base}/batch_cleared.msgpack")
        mixed = encoder.encode(FIXTURE_TS, stored + removed + cleared)
        assert mixed == fixture_bytes(f"{base}/batch_mixed.msgpack")
        assert msgpack.unpackb(mixed) == msgpack.unpackb(fixture_bytes(f"{base}/batch_mixed.msgpack"))


def test_map_era_omits_default_fields_and_array_era_keeps_twelve() -> None:
    stored, _, _ = fixture_scenario()
    array_event = msgpack.unpackb(BatchEncoder("array").encode(0.0, stored))[1][0]
    map_event = msgpack.unpackb(BatchEncoder("map").encode(0.0, stored))[1][0]
    assert len(array_event) == 12 and array_event[0] == "BlockStored"
    assert "kv_cache_spec_sliding_window" not in map_event and "locality" not in map_event
    assert map_event["extra_keys"] == [None, None]


def test_sglang_pages_match_fixture() -> None:
    stored, removed, cleared = fixture_scenario("sglang")
    encoder = BatchEncoder("sglang")
    base = "sglang/sglang-20260723-bd3f6a7"
    assert encoder.encode(FIXTURE_TS, stored) == fixture_bytes(f"{base}/batch_stored_page16.msgpack")
    assert encoder.encode(FIXTURE_TS, cleared) == fixture_bytes(f"{base}/batch_cleared.msgpack")
    # SGLang removes whole radix nodes; the sim groups one step's evictions into one event.
    all_removed = [RemovedEvent((d,)) for e in stored for d in e.digests]  # type: ignore[union-attr]
    ours = msgpack.unpackb(encoder.encode(FIXTURE_TS, all_removed))
    theirs = msgpack.unpackb(fixture_bytes(f"{base}/batch_removed_page16.msgpack"))
    assert ours[1][0][0] == theirs[1][0][0] == "BlockRemoved"
    assert sorted(ours[1][0][1]) == sorted(theirs[1][0][1])
    assert ours[1][0][2] == theirs[1][0][2] == "GPU"
    assert len(removed) == 1


def test_cache_salt_is_published_in_first_block_extra_keys() -> None:
    pool = BlockPool(8, 16)
    kv = KVCacheManager(pool)
    request = SimRequest("r", [*T1, *T2, 5], [1], block_size=16, hash_root=none_hash("0"), cache_salt="cr1.salt")
    assert kv.allocate_slots(request, 33)
    event = msgpack.unpackb(BatchEncoder("map").encode(0.0, pool.take_events()))[1][0]
    assert event["extra_keys"] == [["cr1.salt"], None]


def test_replay_frame_shapes_per_era() -> None:
    assert replay_reply_frames("map", b"kv", 3, b"p") == [b"kv", (3).to_bytes(8, "big"), b"p"]
    assert replay_reply_frames("array", b"kv", 3, b"p") == [(3).to_bytes(8, "big"), b"p"]
    assert replay_reply_frames("sglang", b"kv", 3, b"p") == [(3).to_bytes(8, "big"), b"p"]
    assert replay_end_frames("map") == [b"", END_SEQ, b""]
    assert replay_end_frames("array") == [END_SEQ, b""]
