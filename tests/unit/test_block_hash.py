"""continuum_common.hashing.blocks: golden vectors from the engines' own KV-event fixtures, and
equality with independent reference implementations (cbor2, pickle, struct) on random input."""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Sequence
from typing import Any

import cbor2
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum_common.hashing.blocks import (
    BlockHashError,
    make_block_hasher,
    sglang_digest,
    vllm_cbor_digest,
    vllm_none_hash,
    wire_hashes,
)
from continuum_sim.protocol.block_hash import chain_hashes, none_hash
from continuum_testing.sim_fixtures import FIXTURES, HASH_INPUTS, T1, T2, T3

U64 = (1 << 64) - 1
VLLM_MAP = "vllm/vllm-20260717-426d48b"
SGLANG = "sglang/sglang-20260723-bd3f6a7"


def stored_events(relative: str) -> list[dict[str, Any]]:
    """BlockStored events of one fixture payload, decoded with msgpack (not the code under test),
    as dicts {block_hashes, parent_block_hash, token_ids, extra_keys?}."""
    batch = msgpack.unpackb((FIXTURES / relative).read_bytes(), raw=False, strict_map_key=False)
    out: list[dict[str, Any]] = []
    for event in batch[1]:
        if isinstance(event, dict):
            if event["type"] == "BlockStored":
                out.append(event)
        elif event[0] == "BlockStored":
            out.append({"block_hashes": event[1], "parent_block_hash": event[2], "token_ids": event[3]})
    return out


# -- references, written from the spec's formulas --------------------------------------------


def ref_cbor_chain(
    seed: str, tokens: Sequence[int], size: int, salt: str | None = None, lora: str | None = None
) -> list[bytes]:
    prev = hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
    out = []
    for i in range(len(tokens) // size):
        keys = ([lora] if lora is not None else []) + ([salt] if salt is not None and i == 0 else [])
        extra = tuple(keys) if keys else None
        obj = (prev, tuple(tokens[i * size : (i + 1) * size]), extra)
        prev = hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
        out.append(prev)
    return out


def ref_pickle_chain(
    seed: str, tokens: Sequence[int], size: int, salt: str | None = None, lora: str | None = None
) -> list[bytes]:
    prev = hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    out = []
    for i in range(len(tokens) // size):
        keys = ([lora] if lora is not None else []) + ([salt] if salt is not None and i == 0 else [])
        obj = (prev, tuple(tokens[i * size : (i + 1) * size]), tuple(keys) if keys else None)
        prev = hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()
        out.append(prev)
    return out


def ref_sglang_chain(tokens: Sequence[int], size: int) -> list[bytes]:
    prev = b""
    out = []
    for i in range(len(tokens) // size):
        page = tokens[i * size : (i + 1) * size]
        prev = hashlib.sha256(prev + struct.pack(f"<{len(page)}I", *page)).digest()
        out.append(prev)
    return out


# -- golden vectors ----------------------------------------------------------------------------


def test_vllm_none_hash_and_chain_match_fixture_hashes() -> None:
    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    assert hasher.root.hex() == HASH_INPUTS["NONE_HASH_hex"]
    digests = hasher.chain(T1 + T2 + T3 + [7, 7, 7])  # the partial 4th block is not hashed
    assert [d.hex() for d in digests] == [HASH_INPUTS[k] for k in ("H1_hex", "H2_hex", "H3_hex")]
    assert wire_hashes(hasher, digests) == [HASH_INPUTS[k] for k in ("H1_u64", "H2_u64", "H3_u64")]


@pytest.mark.parametrize(
    "relative",
    [f"{VLLM_MAP}/batch_stored.msgpack", "vllm/vllm-20260512-bcb9c13/batch_stored.msgpack"],
)
def test_vllm_event_hashes_equal_recomputed(relative: str) -> None:
    """Every BlockStored in the fixture: recompute from its tokens and parent → its block_hashes."""
    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    digests = hasher.chain(T1 + T2 + T3)
    by_wire = {hasher.wire(d): d for d in digests}
    events = stored_events(relative)
    assert len(events) == 2
    for event in events:
        parent_wire = event["parent_block_hash"]
        parent = None if parent_wire is None else by_wire[parent_wire]
        start = 0 if parent is None else digests.index(parent) + 1
        got = hasher.chain(event["token_ids"], parent=parent, start_block=start)
        assert [hasher.wire(d) for d in got] == event["block_hashes"]


def test_vllm_bytes_hash_fixture_carries_the_full_digests() -> None:
    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    events = stored_events(f"{VLLM_MAP}/batch_stored_byteshash.msgpack")
    assert [h for e in events for h in e["block_hashes"]] == hasher.chain(T1 + T2 + T3)


def test_vllm_lora_and_salt_extra_keys_fixture() -> None:
    """Block 0 of the extra-keys fixture carries (lora_name, cache_salt); block 1 (lora_name, mm)."""
    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    (event,) = stored_events(f"{VLLM_MAP}/batch_stored_extra_keys.msgpack")
    assert event["extra_keys"][0] == ["adapter-a", "tenant-a"]
    first = hasher.chain(T1, cache_salt="tenant-a", lora_name="adapter-a")
    assert hasher.wire(first[0]) == event["block_hashes"][0]
    mm = event["extra_keys"][1]
    second = vllm_cbor_digest(first[0], T2, (mm[0], tuple(mm[1])))
    assert hasher.wire(second) == event["block_hashes"][1]
    # LoRA alone on block 1 differs from the fixture's (lora, mm) keys: the keys really count.
    assert hasher.chain(T2, parent=first[0], start_block=1, lora_name="adapter-a")[0] != second


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_sglang_formula_matches_page16_and_page1_fixtures(engine: str) -> None:
    page16 = [e["block_hashes"][0] & U64 for e in stored_events(f"{SGLANG}/batch_stored_page16.msgpack")]
    hasher = make_block_hasher(engine, 16)  # type: ignore[arg-type]
    assert hasher.root == b""
    assert wire_hashes(hasher, hasher.chain(T1 + T2 + T3)) == page16
    page1 = [e["block_hashes"][0] & U64 for e in stored_events(f"{SGLANG}/batch_stored_page1.msgpack")]
    one = make_block_hasher(engine, 1)  # type: ignore[arg-type]
    assert wire_hashes(one, one.chain(T1[:3])) == page1
    # SGLang's event value is the signed int64 of the first 8 bytes; wire() is its u64 reading.
    signed = stored_events(f"{SGLANG}/batch_stored_page1.msgpack")[0]["block_hashes"][0]
    assert signed < 0 and one.wire(one.chain(T1[:1])[0]) == signed + (1 << 64)


def test_sglang_ignores_salt_and_lora_and_chains_from_parent() -> None:
    hasher = make_block_hasher("sglang", 16)
    whole = hasher.chain(T1 + T2 + T3)
    assert hasher.chain(T1 + T2 + T3, cache_salt="s", lora_name="l") == whole
    assert hasher.chain(T2 + T3, parent=whole[0], start_block=1) == whole[1:]
    assert sglang_digest(None, T1) == whole[0]


# -- random inputs against the references ------------------------------------------------------

token_ids = st.lists(
    st.one_of(
        st.integers(0, 300),
        st.integers(0, 70_000),
        st.integers(0, (1 << 32) - 1),
        st.integers(0, U64),
    ),
    max_size=80,
)
sizes = st.sampled_from([1, 2, 3, 16, 23, 24, 25, 32])
names = st.one_of(st.none(), st.text(max_size=30))


@settings(max_examples=300, deadline=None)
@given(tokens=token_ids, size=sizes, salt=names, lora=names, seed=st.sampled_from(["0", "1", "42", "é"]))
def test_vllm_cbor_equals_cbor2_reference(
    tokens: list[int], size: int, salt: str | None, lora: str | None, seed: str
) -> None:
    hasher = make_block_hasher("vllm", size, hash_seed=seed)
    expected = ref_cbor_chain(seed, tokens, size, salt, lora)
    assert hasher.chain(tokens, cache_salt=salt, lora_name=lora) == expected
    if lora is None:
        assert chain_hashes(tokens, size, none_hash(seed), cache_salt=salt) == expected  # the simulator's
    # Resuming mid-chain gives the same digests; the salt belongs to block 0 only.
    if len(expected) >= 2:
        rest = hasher.chain(tokens[size:], parent=expected[0], start_block=1, cache_salt=salt, lora_name=lora)
        assert rest == expected[1:]


long_token_ids = st.lists(st.integers(0, 200_000), min_size=128, max_size=700) | st.lists(
    st.one_of(st.integers(0, 30), st.integers(0, (1 << 32) - 1), st.integers(0, U64)), min_size=128, max_size=300
)


@settings(max_examples=100, deadline=None)
@given(tokens=long_token_ids, size=sizes, salt=names)
def test_vllm_cbor_long_chains_equal_cbor2_reference(tokens: list[int], size: int, salt: str | None) -> None:
    """Long chains take the vectorised CBOR path (ids beyond 2**32 fall back per token)."""
    hasher = make_block_hasher("vllm", size, hash_seed="0")
    assert hasher.chain(tokens, cache_salt=salt) == ref_cbor_chain("0", tokens, size, salt)


@settings(max_examples=200, deadline=None)
@given(tokens=token_ids, size=sizes, salt=names, lora=names)
def test_vllm_pickle_equals_pickle_reference(tokens: list[int], size: int, salt: str | None, lora: str | None) -> None:
    hasher = make_block_hasher("vllm", size, hash_seed="0", vllm_hash_algo="sha256")
    assert hasher.root == vllm_none_hash("0", "sha256")
    expected = ref_pickle_chain("0", tokens, size, salt, lora)
    assert hasher.chain(tokens, cache_salt=salt, lora_name=lora) == expected
    if len(expected) >= 2:
        rest = hasher.chain(tokens[size:], parent=expected[0], start_block=1, cache_salt=salt, lora_name=lora)
        assert rest == expected[1:]


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, (1 << 32) - 1), max_size=80), size=sizes)
def test_sglang_equals_struct_reference(tokens: list[int], size: int) -> None:
    hasher = make_block_hasher("sglang", size)
    expected = ref_sglang_chain(tokens, size)
    assert hasher.chain(tokens) == expected
    assert wire_hashes(hasher, expected) == [int.from_bytes(d[:8], "big") for d in expected]


def test_wire_takes_the_documented_bytes() -> None:
    digest = bytes(range(32))
    assert make_block_hasher("vllm", 4, hash_seed="0").wire(digest) == int.from_bytes(bytes(range(24, 32)), "big")
    assert make_block_hasher("sglang", 4).wire(digest) == int.from_bytes(bytes(range(8)), "big")


# -- bad input -----------------------------------------------------------------------------------


def test_bad_configuration_and_token_ids_raise_block_hash_error() -> None:
    with pytest.raises(BlockHashError, match="PYTHONHASHSEED"):
        make_block_hasher("vllm", 16)
    with pytest.raises(BlockHashError, match="unknown engine"):
        make_block_hasher("tgi", 16)  # type: ignore[arg-type]
    with pytest.raises(BlockHashError, match="algorithm"):
        make_block_hasher("vllm", 16, hash_seed="0", vllm_hash_algo="xxhash")  # type: ignore[arg-type]
    with pytest.raises(BlockHashError, match="block_size"):
        make_block_hasher("sglang", 0)
    for engine, algo in (("vllm", "sha256_cbor"), ("vllm", "sha256")):
        hasher = make_block_hasher(engine, 2, hash_seed="0", vllm_hash_algo=algo)  # type: ignore[arg-type]
        with pytest.raises(BlockHashError):
            hasher.chain([1, -1])
        with pytest.raises(BlockHashError):
            hasher.chain([1, 1 << 64])
    with pytest.raises(BlockHashError):
        make_block_hasher("sglang", 2).chain([1, 1 << 32])
    for algo in ("sha256_cbor", "sha256"):
        with pytest.raises(BlockHashError, match="integers"):
            make_block_hasher("vllm", 2, hash_seed="0", vllm_hash_algo=algo).chain([1, "x"])  # type: ignore[arg-type, list-item]
    # ValueError too, so callers that only know the builtin still catch it.
    with pytest.raises(ValueError):
        make_block_hasher("sglang", 2).chain([-1, 0])
