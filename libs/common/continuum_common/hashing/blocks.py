"""Engine block hashes, reproduced bit for bit (docs/hashing.md, "Engine block hashes").

    hasher = make_block_hasher("vllm", 16, hash_seed="0")
    digests = hasher.chain(token_ids)              # one 32-byte digest per FULL block
    wire = [hasher.wire(d) for d in digests]       # the u64s the engine's KV events carry
    more = hasher.chain(new_tokens, parent=digests[-1], start_block=len(digests))

Engines (kv-events-spec.md §1.6, §1.7, §2.3):

* ``vllm`` — ``H_i = hash_fn((H_{i-1} or NONE_HASH, tuple(tokens_i), extra_keys_i))`` with
  ``hash_fn`` = ``sha256_cbor`` (SHA-256 of canonical CBOR) or ``sha256`` (SHA-256 of
  ``pickle.dumps(obj, HIGHEST_PROTOCOL)``, vLLM's default; reproducible in CPython only).
  ``NONE_HASH = hash_fn(PYTHONHASHSEED)`` (the *string*). ``extra_keys_i`` = ``[lora_name]`` on
  every block of a LoRA request, then ``[cache_salt]`` on block 0 only, as a tuple; None when
  empty. Wire value: the last 8 digest bytes as a big-endian u64.
* ``sglang`` — ``d_i = sha256(d_{i-1} || tokens_i as uint32 little-endian)`` with nothing before
  the first page's tokens; no seed, LoRA or salt input (SGLang has none). Wire value: the first
  8 digest bytes as a big-endian u64 (SGLang's signed int64 read as unsigned).
* ``trtllm`` — the SGLang formula: the listener re-keys TensorRT-LLM's opaque block hashes to it.

The CBOR of a vLLM block is written by hand (spec §1.7): ``83`` · ``58 20`` + parent · array
header · one canonical CBOR uint per token · extra keys (``f6`` or their canonical CBOR). For a
long chain the tokens' CBOR is computed for all blocks at once with numpy (a header byte and the
id's last 0, 1, 2 or 4 big-endian bytes per token), and each block is a slice of it; a short one
joins per-token encodings from a table of the 65,536 smallest ids built once per process. Either
way a block costs a few slices and one SHA-256.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import pickle
import struct
from array import array
from collections.abc import Sequence
from typing import Final, Literal, Protocol

import cbor2
import numpy as np

from continuum_common.errors import ContinuumError

Engine = Literal["vllm", "sglang", "trtllm"]
VllmHashAlgo = Literal["sha256_cbor", "sha256"]
ENGINES: Final = ("vllm", "sglang", "trtllm")
VLLM_HASH_ALGOS: Final = ("sha256_cbor", "sha256")

_U64_MASK: Final = (1 << 64) - 1
_TABLE_SIZE: Final = 1 << 16
_VECTOR_MIN_TOKENS: Final = 128  # below this the per-token table is cheaper than numpy's call overhead
_CBOR_NULL: Final = b"\xf6"


class BlockHashError(ContinuumError, ValueError):
    """A block hasher was configured wrongly or fed token ids no engine could hold."""


class BlockHasher(Protocol):
    """What every engine's hasher offers (see the module docstring for the formulas)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def block_size(self) -> int: ...

    @property
    def root(self) -> bytes:
        """The parent digest of block 0 (vLLM's NONE_HASH; empty for SGLang's formula)."""
        ...

    def chain(
        self,
        tokens: Sequence[int],
        *,
        parent: bytes | None = None,
        start_block: int = 0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> list[bytes]:
        """Digests of the full blocks of `tokens`, which start at block `start_block` (token
        index ``start_block * block_size``); `parent` is the digest of the block before (None =
        the root). A trailing partial block is not hashed."""
        ...

    def wire(self, digest: bytes) -> int:
        """The unsigned 64-bit value the engine's KV event carries for `digest`."""
        ...


# -- CBOR --------------------------------------------------------------------------------------


def _cbor_head(major: int, value: int) -> bytes:
    """A canonical CBOR head: major type in the top 3 bits, the shortest argument encoding."""
    base = major << 5
    if value < 24:
        return bytes((base | value,))
    if value < 1 << 8:
        return bytes((base | 24, value))
    if value < 1 << 16:
        return bytes((base | 25,)) + value.to_bytes(2, "big")
    if value < 1 << 32:
        return bytes((base | 26,)) + value.to_bytes(4, "big")
    return bytes((base | 27,)) + value.to_bytes(8, "big")


def _cbor_uint(value: int) -> bytes:
    if not 0 <= value <= _U64_MASK:
        raise BlockHashError("token ids must be integers in [0, 2**64)")
    return _cbor_head(0, value)


@functools.cache
def _uint_table() -> tuple[bytes, ...]:
    """Canonical CBOR of every id below 65,536 (immutable; built once per process, ~3 MB)."""
    small = [bytes((v,)) for v in range(24)]
    one_byte = list(map(struct.Struct(">BB").pack, itertools.repeat(0x18), range(24, 256)))
    two_bytes = list(map(struct.Struct(">BH").pack, itertools.repeat(0x19), range(256, _TABLE_SIZE)))
    return tuple(small + one_byte + two_bytes)


def _cbor_tokens(tokens: Sequence[int]) -> list[bytes]:
    """One CBOR item per token id, in C for ids in the table."""
    table = _uint_table()
    try:
        if tokens and min(tokens) < 0:  # a negative index would silently read the table's end
            raise BlockHashError("token ids must be integers in [0, 2**64)")
        return list(map(table.__getitem__, tokens))
    except IndexError:
        return [table[t] if t < _TABLE_SIZE else _cbor_uint(t) for t in tokens]
    except TypeError:
        raise BlockHashError("token ids must be integers") from None


def _cbor_stream(tokens: Sequence[int], block_size: int) -> tuple[bytes, list[int]] | None:
    """The tokens' CBOR items back to back and the byte offset of every block boundary; None
    when an id is outside [0, 2**32) (the per-token path handles or rejects those)."""
    try:
        ids = np.frombuffer(array("I", tokens), dtype=np.uint32)
    except (OverflowError, TypeError):
        return None
    width = 1 + (ids >= 24).astype(np.int64) + (ids >= 256) + 2 * (ids >= 65536).astype(np.int64)
    head = np.where(ids < 24, ids, np.where(ids < 256, 0x18, np.where(ids < 65536, 0x19, 0x1A)))
    rows = np.empty((ids.size, 5), dtype=np.uint8)
    rows[:, 0] = head
    rows[:, 1:] = ids.astype(">u4").view(np.uint8).reshape(-1, 4)
    keep = np.arange(5)[None, :] >= (6 - width)[:, None]  # the id's last (width - 1) bytes
    keep[:, 0] = True
    ends = np.cumsum(width)[block_size - 1 :: block_size]
    return rows[keep].tobytes(), [0, *ends.tolist()]


def _cbor_extra(extra_keys: tuple[object, ...] | None) -> bytes:
    return _CBOR_NULL if extra_keys is None else cbor2.dumps(extra_keys, canonical=True)


def _extra_keys(index: int, cache_salt: str | None, lora_name: str | None) -> tuple[object, ...] | None:
    """vLLM's `generate_block_hash_extra_keys` for a text request: lora first, salt on block 0."""
    keys: list[object] = []
    if lora_name is not None:
        keys.append(lora_name)
    if cache_salt is not None and index == 0:
        keys.append(cache_salt)
    return tuple(keys) if keys else None


def vllm_cbor_digest(parent: bytes, tokens: Sequence[int], extra_keys: tuple[object, ...] | None) -> bytes:
    """One vLLM ``sha256_cbor`` block hash with arbitrary extra keys (LoRA, multimodal, salt)."""
    body = b"\x83" + _cbor_head(2, len(parent)) + parent + _cbor_head(4, len(tokens))
    return hashlib.sha256(body + b"".join(_cbor_tokens(tokens)) + _cbor_extra(extra_keys)).digest()


def vllm_pickle_digest(parent: bytes, tokens: Sequence[int], extra_keys: tuple[object, ...] | None) -> bytes:
    """One vLLM ``sha256`` (pickle) block hash, exactly as vLLM's CPython computes it."""
    data = pickle.dumps((parent, tuple(tokens), extra_keys), protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(data).digest()


def vllm_none_hash(hash_seed: str, algo: VllmHashAlgo = "sha256_cbor") -> bytes:
    """vLLM's NONE_HASH: the hash function applied to the PYTHONHASHSEED string."""
    if algo == "sha256_cbor":
        return hashlib.sha256(cbor2.dumps(hash_seed, canonical=True)).digest()
    return hashlib.sha256(pickle.dumps(hash_seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sglang_digest(prior: bytes | None, tokens: Sequence[int]) -> bytes:
    """SGLang's page digest: sha256(prior || tokens as uint32 LE); no prior at the root."""
    return hashlib.sha256((prior or b"") + _uint32le(tokens)).digest()


def _uint32le(tokens: Sequence[int]) -> bytes:
    try:
        data = array("I", tokens)
    except (OverflowError, TypeError):
        raise BlockHashError("SGLang-formula token ids must be integers in [0, 2**32)") from None
    if data.itemsize != 4:  # pragma: no cover - every platform CPython supports has a 4-byte "I"
        raise BlockHashError("array('I') is not 4 bytes wide on this platform")
    if array("I", b"\x01\x00\x00\x00")[0] != 1:  # pragma: no cover - big-endian hosts
        data.byteswap()
    return data.tobytes()


# -- hashers -----------------------------------------------------------------------------------


class _Hasher:
    __slots__ = ("_block_size", "_root")

    def __init__(self, block_size: int, root: bytes) -> None:
        if block_size < 1:
            raise BlockHashError("block_size must be >= 1")
        self._block_size = block_size
        self._root = root

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def root(self) -> bytes:
        return self._root

    def _blocks(self, tokens: Sequence[int], start_block: int) -> int:
        if start_block < 0:
            raise BlockHashError("start_block must be >= 0")
        return len(tokens) // self._block_size


class VllmCborHasher(_Hasher):
    """vLLM with ``--prefix-caching-hash-algo sha256_cbor``."""

    __slots__ = ("_array_head",)

    def __init__(self, block_size: int, root: bytes) -> None:
        super().__init__(block_size, root)
        self._array_head = _cbor_head(4, block_size)
        _uint_table()  # pay the one-time table build now, not on a request

    @property
    def engine(self) -> Engine:
        return "vllm"

    def chain(
        self,
        tokens: Sequence[int],
        *,
        parent: bytes | None = None,
        start_block: int = 0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> list[bytes]:
        count = self._blocks(tokens, start_block)
        if count == 0:
            return []
        size = self._block_size
        full = tokens[: count * size]
        stream = _cbor_stream(full, size) if len(full) >= _VECTOR_MIN_TOKENS else None
        if stream is not None:
            data, bounds = stream
            bodies = [data[bounds[k] : bounds[k + 1]] for k in range(count)]
        else:
            items, join = _cbor_tokens(full), b"".join
            bodies = [join(items[k * size : (k + 1) * size]) for k in range(count)]
        every = _cbor_extra(_extra_keys(1, None, lora_name))
        first = _cbor_extra(_extra_keys(0, cache_salt, lora_name)) if start_block == 0 else every
        sha, head = hashlib.sha256, self._array_head
        prev = self._root if parent is None else parent
        out: list[bytes] = []
        for k, body in enumerate(bodies):
            extra = first if k == 0 else every
            prefix = b"\x83\x58\x20" if len(prev) == 32 else b"\x83" + _cbor_head(2, len(prev))
            prev = sha(prefix + prev + head + body + extra).digest()
            out.append(prev)
        return out

    def wire(self, digest: bytes) -> int:
        return int.from_bytes(digest[-8:], "big")


class VllmPickleHasher(_Hasher):
    """vLLM with ``--prefix-caching-hash-algo sha256`` (the default): pickle, HIGHEST_PROTOCOL."""

    __slots__ = ()

    @property
    def engine(self) -> Engine:
        return "vllm"

    def chain(
        self,
        tokens: Sequence[int],
        *,
        parent: bytes | None = None,
        start_block: int = 0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> list[bytes]:
        count = self._blocks(tokens, start_block)
        size = self._block_size
        _check_ids(tokens[: count * size])
        prev = self._root if parent is None else parent
        out: list[bytes] = []
        for k in range(count):
            lo = k * size
            extra = _extra_keys(start_block + k, cache_salt, lora_name)
            prev = vllm_pickle_digest(prev, tokens[lo : lo + size], extra)
            out.append(prev)
        return out

    def wire(self, digest: bytes) -> int:
        return int.from_bytes(digest[-8:], "big")


def _check_ids(tokens: Sequence[int]) -> None:
    # Pickle would hash anything; keep the domain the CBOR hasher accepts so both agree.
    try:
        if tokens and (min(tokens) < 0 or max(tokens) > _U64_MASK):
            raise BlockHashError("token ids must be integers in [0, 2**64)")
    except TypeError:
        raise BlockHashError("token ids must be integers") from None


class SglangHasher(_Hasher):
    """SGLang's page chain; also TensorRT-LLM's blocks as the listener re-keys them."""

    __slots__ = ("_engine",)

    def __init__(self, block_size: int, engine: Engine = "sglang") -> None:
        super().__init__(block_size, b"")
        self._engine: Engine = engine

    @property
    def engine(self) -> Engine:
        return self._engine

    def chain(
        self,
        tokens: Sequence[int],
        *,
        parent: bytes | None = None,
        start_block: int = 0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> list[bytes]:
        # SGLang folds neither a salt nor a LoRA name into its page hashes.
        count = self._blocks(tokens, start_block)
        if count == 0:
            return []
        step = self._block_size * 4
        data = _uint32le(tokens[: count * self._block_size])
        sha = hashlib.sha256
        prev = parent or b""
        out: list[bytes] = []
        for k in range(count):
            prev = sha(prev + data[k * step : (k + 1) * step]).digest()
            out.append(prev)
        return out

    def wire(self, digest: bytes) -> int:
        return int.from_bytes(digest[:8], "big")


def make_block_hasher(
    engine: Engine,
    block_size: int,
    *,
    hash_seed: str | None = None,
    vllm_hash_algo: VllmHashAlgo = "sha256_cbor",
) -> BlockHasher:
    """The hasher of `engine` for blocks of `block_size` tokens. vLLM needs `hash_seed`, the
    engines' PYTHONHASHSEED (without one vLLM seeds randomly and nobody can recompute it)."""
    if engine == "vllm":
        if hash_seed is None:
            raise BlockHashError("vLLM block hashes need the engines' PYTHONHASHSEED (hash_seed)")
        if vllm_hash_algo == "sha256_cbor":
            return VllmCborHasher(block_size, vllm_none_hash(hash_seed, "sha256_cbor"))
        if vllm_hash_algo == "sha256":
            return VllmPickleHasher(block_size, vllm_none_hash(hash_seed, "sha256"))
        raise BlockHashError(f"unknown vLLM hash algorithm {vllm_hash_algo!r} (known: {VLLM_HASH_ALGOS})")
    if engine in ("sglang", "trtllm"):
        return SglangHasher(block_size, engine)
    raise BlockHashError(f"unknown engine {engine!r} (known: {ENGINES})")


def wire_hashes(hasher: BlockHasher, digests: Sequence[bytes]) -> list[int]:
    """`hasher.wire` over a list (the u64 chain the block index is queried with)."""
    wire = hasher.wire
    return [wire(d) for d in digests]
