"""The simulator's block hashes: vLLM's `sha256_cbor` chain (the prefix-cache key and what
vLLM-era events carry) and SGLang's page chain (what `sglang`-era events carry).

The formulas live in `continuum_common.hashing.blocks`, the one implementation the ingress,
the listener and the simulator share (docs/hashing.md); this module adapts it to the
simulator's call sites. The simulator hashes like vLLM with `--prefix-caching-hash-algo
sha256_cbor` and a text-only, LoRA-less request: block 0 carries `(cache_salt,)` as its extra
keys when the request has a salt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from continuum_common.hashing.blocks import (
    VllmCborHasher,
    sglang_digest,
    vllm_cbor_digest,
    vllm_none_hash,
)

HashWire = Literal["int", "bytes"]
_U64_MASK = (1 << 64) - 1


def none_hash(python_hash_seed: str) -> bytes:
    """vLLM's NONE_HASH for a given PYTHONHASHSEED value (the chain's root parent)."""
    return vllm_none_hash(python_hash_seed, "sha256_cbor")


def hash_block_tokens(parent: bytes, tokens: Sequence[int], extra_keys: tuple[object, ...] | None) -> bytes:
    """`sha256_cbor((parent, tuple(tokens), extra_keys))` — one vLLM block hash."""
    return vllm_cbor_digest(parent, tokens, extra_keys)


def block_extra_keys(block_index: int, cache_salt: str | None) -> tuple[object, ...] | None:
    """vLLM's `generate_block_hash_extra_keys` for a text-only, LoRA-less request: the salt
    goes into the first block only."""
    if block_index == 0 and cache_salt is not None:
        return (cache_salt,)
    return None


def chain_hashes(
    tokens: Sequence[int],
    block_size: int,
    root: bytes,
    *,
    cache_salt: str | None = None,
    start: int = 0,
    parent: bytes | None = None,
) -> list[bytes]:
    """Hashes of the full blocks of `tokens` from block `start` on (`parent` = hash of block
    start-1, or None for the chain root)."""
    hasher = VllmCborHasher(block_size, root)
    return hasher.chain(tokens[start * block_size :], parent=parent, start_block=start, cache_salt=cache_salt)


def vllm_wire_hash(digest: bytes, mode: HashWire) -> int | bytes:
    """The value vLLM puts on the wire for one block hash."""
    if mode == "bytes":
        return digest
    return int.from_bytes(digest, "big") & _U64_MASK


def sglang_page_digest(prior: bytes | None, tokens: Sequence[int]) -> bytes:
    """SGLang's chained page digest (32 raw bytes)."""
    return sglang_digest(prior, tokens)


def sglang_wire_hash(digest: bytes) -> int:
    """`hash_str_to_int64(hexdigest)`: the first 8 bytes as a signed big-endian int64."""
    return int.from_bytes(digest[:8], "big", signed=True)
