"""The simulator's block hashes are vLLM's sha256_cbor chain and SGLang's page chain, reproduced
from the fixture README's recipe and values."""

from __future__ import annotations

import json

from continuum_sim.protocol.block_hash import (
    block_extra_keys,
    chain_hashes,
    hash_block_tokens,
    none_hash,
    sglang_page_digest,
    sglang_wire_hash,
    vllm_wire_hash,
)
from continuum_testing.sim_fixtures import FIXTURES, HASH_INPUTS, T1, T2, T3


def test_none_hash_is_sha256_cbor_of_pythonhashseed_string() -> None:
    assert none_hash("0").hex() == HASH_INPUTS["NONE_HASH_hex"]
    assert none_hash("1") != none_hash("0")


def test_chain_reproduces_fixture_h1_h2_h3() -> None:
    digests = chain_hashes(T1 + T2 + T3, 16, none_hash("0"))
    assert [d.hex() for d in digests] == [HASH_INPUTS["H1_hex"], HASH_INPUTS["H2_hex"], HASH_INPUTS["H3_hex"]]
    assert [vllm_wire_hash(d, "int") for d in digests] == [
        HASH_INPUTS["H1_u64"], HASH_INPUTS["H2_u64"], HASH_INPUTS["H3_u64"],
    ]  # fmt: skip
    assert vllm_wire_hash(digests[0], "bytes") == digests[0]


def test_partial_block_is_not_hashed_and_chain_resumes() -> None:
    root = none_hash("0")
    assert len(chain_hashes(T1 + T2[:15], 16, root)) == 1
    first = chain_hashes(T1, 16, root)
    rest = chain_hashes(T1 + T2 + T3, 16, root, start=1, parent=first[0])
    assert first + rest == chain_hashes(T1 + T2 + T3, 16, root)


def test_extra_keys_fixture_lora_salt_and_multimodal() -> None:
    """batch_stored_extra_keys: extra keys (lora_name, cache_salt) and (lora_name, (mm_hash, offset))."""
    meta = json.loads((FIXTURES / "vllm/vllm-20260717-426d48b/batch_stored_extra_keys.json").read_text())
    event = meta["decoded"][1][0]
    first_keys = tuple(event["extra_keys"][0])
    second_keys = (event["extra_keys"][1][0], tuple(event["extra_keys"][1][1]))
    h1 = hash_block_tokens(none_hash("0"), T1, first_keys)
    h2 = hash_block_tokens(h1, T2, second_keys)
    assert [vllm_wire_hash(h1, "int"), vllm_wire_hash(h2, "int")] == event["block_hashes"]


def test_cache_salt_goes_into_first_block_only() -> None:
    root = none_hash("0")
    salted = chain_hashes(T1 + T2, 16, root, cache_salt="tenant-a")
    assert salted[0] == hash_block_tokens(root, T1, ("tenant-a",))
    assert salted[1] == hash_block_tokens(salted[0], T2, None)
    assert salted[0] != chain_hashes(T1, 16, root)[0]
    assert block_extra_keys(0, None) is None
    assert block_extra_keys(1, "tenant-a") is None


def test_sglang_page_hashes_match_fixture() -> None:
    meta = json.loads((FIXTURES / "sglang/sglang-20260723-bd3f6a7/batch_stored_page16.json").read_text())
    expected = [e[1][0] for e in meta["decoded"][1]]
    d1 = sglang_page_digest(None, T1)
    d2 = sglang_page_digest(d1, T2)
    d3 = sglang_page_digest(d2, T3)
    assert [sglang_wire_hash(d) for d in (d1, d2, d3)] == expected
