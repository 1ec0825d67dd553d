"""Engine-neutral shapes every decoder produces and the chain tracker consumes.

Hashes are normalized to Python ints so the tracker never cares which engine or era produced
them (kv-events-spec §1.6, §2.3, §3.2):

* msgpack uint64 → itself;
* negative int64 (old vLLM builtin hash, SGLang) → its two's-complement uint64 (what Dynamo does);
* raw digest bytes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`) → the last 8 bytes as big-endian
  uint64, exactly the value vLLM publishes in its default int mode, so a bytes-hash source and an
  int-hash source describe the same chain with the same numbers;
* TensorRT-LLM hex strings (KV cache manager v2) → the integer they spell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from continuum_common.events import Tier
from continuum_listener.errors import DecodeError

_U64 = 1 << 64
_I64_MIN = -(1 << 63)

# Metric label values for `continuum_kv_event_dropped_total{reason}` (an allow-list: anything
# else is reported as "other").
DROP_REASONS = frozenset(
    {
        "frames",  # wrong frame count or a seq frame that is not 8 bytes
        "too_large",  # payload, array or event over the configured bounds
        "msgpack",  # truncated or garbage msgpack
        "json",  # TRT-LLM body that is not JSON
        "schema",  # decodable but the wrong shape or types
        "unknown_tag",  # an event type this listener does not know
        "attention_group",  # a non-main attention group (sliding window, mamba, ...)
        "duplicate",  # TRT-LLM event_id already applied
        "publish_buffer_full",  # NATS unreachable for longer than the buffer lasts
        "replay_lost",  # batches that neither live delivery nor replay recovered
        "window",  # TRT-LLM event for a smaller attention window than the tracked one
        "http",  # TRT-LLM poll answered with a non-200 status or a redirect
        "partial_block",  # a block with fewer tokens than the source's block size (block mode)
        "unknown_parent",  # TRT-LLM block whose parent was never re-keyed (block mode)
        "unknown_block",  # TRT-LLM removal/move of a block this listener never re-keyed
        "unkeyed_block",  # TRT-LLM block with multimodal extra token ids (cannot be re-keyed)
        "other",
    }
)

GPU_MEDIA = frozenset({"GPU", "DEVICE"})
# Every medium name seen in vLLM, SGLang, TRT-LLM and Dynamo (spec §4.1) that is not GPU memory.
STORAGE_MEDIA = frozenset(
    {
        "CPU",
        "CPU_PINNED",
        "CPU_TIER1",
        "CPU_TIER2",
        "DISK",
        "NVME",
        "STORAGE",
        "FS",
        "OBJ",
        "EXTERNAL",
        "NETWORK",
        "REMOTE",
        "SHARED",
    }
)
GPU = "GPU"
# TensorRT-LLM reports cache levels, not media: 0 = primary (GPU), 1+ = secondary (host).
TRT_LEVEL_MEDIA = ("GPU", "CPU")


def medium_tier(medium: str | None) -> Tier:
    """gpu_hot for GPU memory (and for a missing medium: engines before the field existed only
    reported GPU blocks), storage_warm for every offload medium, including names not yet known."""
    if medium is None or medium.upper() in GPU_MEDIA:
        return Tier.GPU_HOT
    return Tier.STORAGE_WARM


def norm_hash(value: Any) -> int:
    """Normalize one engine block hash (see the module docstring); DecodeError when invalid."""
    kind = type(value)
    if kind is int:
        if 0 <= value < _U64:
            return int(value)
        if _I64_MIN <= value < 0:
            return int(value) + _U64
    elif kind is bytes:
        if 1 <= len(value) <= 64:
            return int.from_bytes(value[-8:], "big")
    elif kind is str and 1 <= len(value) <= 64:
        try:
            return int(value, 16)
        except ValueError:
            pass
    raise DecodeError("schema", "block hash is not a uint64, int64, digest or hex string")


@dataclass(slots=True)
class Stored:
    """New blocks, chained: block i's parent is block i-1, block 0's parent is `parent`."""

    hashes: list[int]
    parent: int | None
    spans: list[int]  # tokens covered by each block
    token_ids: list[Any]  # concatenated segments, raw (validated only when retained)
    tokens_ok: bool  # token_ids lines up with spans (block_size check passed)
    mismatch: bool  # a non-empty token list did not match block_size (seed rule)
    medium: str | None = GPU
    salts: list[str | None] | None = None  # per-block salt candidates ("cr1." strings)
    lora_name: str | None = None
    placeholder: bool = False  # offload placeholder: token_ids == [] and block_size == 0
    block_size: int = 0  # the event's block_size field (TensorRT-LLM: tokens of its longest block)
    # TensorRT-LLM only: indices of blocks whose content cannot be re-keyed (multimodal extra
    # token ids, token ids outside uint32); token_ids then holds plain ints, one per token.
    unkeyed: tuple[int, ...] = ()


@dataclass(slots=True)
class Removed:
    hashes: list[int]
    medium: str | None = GPU  # None: gone from every medium (TensorRT-LLM removal)


@dataclass(slots=True)
class Moved:
    """A block changed medium (TensorRT-LLM `updated` with a cache_level diff)."""

    hash: int
    old_medium: str
    new_medium: str


@dataclass(slots=True)
class Cleared:
    """Every block of the source is gone (AllBlocksCleared, TRT-LLM `created`)."""


EngineEvent = Stored | Removed | Moved | Cleared


@dataclass(slots=True)
class Batch:
    """One decoded engine batch; events that could not be used are counted in `skipped`."""

    ts: float
    rank: int | None
    events: list[EngineEvent]
    skipped: dict[str, int] = field(default_factory=dict)
    unknown_fields: int = 0

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
