"""Block hashes exactly as vLLM computes them with `--prefix-caching-hash-algo sha256_cbor`,
and SGLang's page hashes for the SGLang event mode.

vLLM (kv-events-spec.md §1.7, `vllm/v1/core/kv_cache_utils.py`):

    NONE_HASH = sha256(cbor2.dumps(PYTHONHASHSEED))                  # the *string* value
    H_i       = sha256(cbor2.dumps((H_{i-1} or NONE_HASH, tuple(tokens_i), extra_keys_i),
                                   canonical=True))
    extra_keys_i = (cache_salt,) for the first block when a salt is given, else None

The event carries `int.from_bytes(H, "big") & (2**64 - 1)` (the last 8 bytes as u64) with
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` (the default) or the raw 32-byte digest with `=0`.

SGLang (spec §2.3): `d_i = sha256(d_{i-1} || tokens as uint32 little-endian)` with no prior
digest for the first page; the event value is the first 8 bytes as a signed int64.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Literal

import cbor2

HashWire = Literal["int", "bytes"]
_U64_MASK = (1 << 64) - 1


def none_hash(python_hash_seed: str) -> bytes:
    """vLLM's NONE_HASH for a given PYTHONHASHSEED value (the chain's root parent)."""
    return hashlib.sha256(cbor2.dumps(python_hash_seed, canonical=True)).digest()


def hash_block_tokens(parent: bytes, tokens: Sequence[int], extra_keys: tuple[object, ...] | None) -> bytes:
    """`sha256_cbor((parent, tuple(tokens), extra_keys))` — one vLLM block hash."""
    return hashlib.sha256(cbor2.dumps((parent, tuple(tokens), extra_keys), canonical=True)).digest()


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
    out: list[bytes] = []
    prev = parent if parent is not None else root
    for index in range(start, len(tokens) // block_size):
        lo = index * block_size
        prev = hash_block_tokens(prev, tokens[lo : lo + block_size], block_extra_keys(index, cache_salt))
        out.append(prev)
    return out


def vllm_wire_hash(digest: bytes, mode: HashWire) -> int | bytes:
    """The value vLLM puts on the wire for one block hash."""
    if mode == "bytes":
        return digest
    return int.from_bytes(digest, "big") & _U64_MASK


def sglang_page_digest(prior: bytes | None, tokens: Sequence[int]) -> bytes:
    """SGLang's chained page digest (32 raw bytes)."""
    data = struct.pack(f"<{len(tokens)}I", *tokens)
    return hashlib.sha256((prior or b"") + data).digest()


def sglang_wire_hash(digest: bytes) -> int:
    """`hash_str_to_int64(hexdigest)`: the first 8 bytes as a signed big-endian int64."""
    return int.from_bytes(digest[:8], "big", signed=True)
