"""Configuration of one simulated engine (frozen dataclasses; `dataclasses.replace` to vary).

Defaults describe an 8B model on one H100 80GB running vLLM with prefix caching and KV events
on (docs/sim-engine.md). Tests shrink `time_scale` and the KV capacity.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from continuum_sim.errors import SimConfigError
from continuum_sim.policy.timing import TimingConfig
from continuum_sim.protocol.block_hash import HashWire
from continuum_sim.protocol.kv_wire import ERAS, Era

ZmqMode = Literal["bind", "connect"]
DEFAULT_MODEL = "continuum-sim-8b"


@dataclass(frozen=True)
class KvEventsConfig:
    """vLLM's `--kv-events-config`, plus the simulator's wire-era choice.

    `endpoint` is where the PUB socket binds (default) or connects (`zmq_mode="connect"`, for a
    listener that binds). Port 0 in a bind endpoint picks a free port. `replay_endpoint` (ROUTER,
    always bound) is off when None. `topic` is frame 0 of every message (vLLM default "").
    """

    enabled: bool = True
    endpoint: str = "tcp://127.0.0.1:0"
    zmq_mode: ZmqMode = "bind"
    replay_endpoint: str | None = "tcp://127.0.0.1:0"
    topic: str = ""
    era: Era = "map"
    hash_wire: HashWire = "int"
    buffer_steps: int = 10_000
    replay_buffer_bytes: int = 16 << 20  # the simulator also bounds the replay buffer in bytes
    hwm: int = 100_000
    data_parallel_rank: int = 0

    def __post_init__(self) -> None:
        if self.era not in ERAS:
            raise SimConfigError(f"kv_events.era must be one of {ERAS}, not {self.era!r}")
        if self.hash_wire not in ("int", "bytes"):
            raise SimConfigError("kv_events.hash_wire must be 'int' or 'bytes'")
        if self.zmq_mode not in ("bind", "connect"):
            raise SimConfigError("kv_events.zmq_mode must be 'bind' or 'connect'")
        if self.buffer_steps < 1 or self.hwm < 1:
            raise SimConfigError("kv_events.buffer_steps and hwm must be >= 1")


@dataclass(frozen=True)
class EngineConfig:
    name: str = "sim-0"
    model: str = DEFAULT_MODEL
    host: str = "127.0.0.1"
    port: int = 0  # 0 = a free port
    block_size: int = 16
    num_gpu_blocks: int = 25_000  # ~400k tokens: 54 GB of KV at 128 KiB/token (Llama-3-8B)
    max_model_len: int = 32_768
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8_192
    max_waiting: int = 4_096  # beyond this, requests get 503 (vLLM's queue is unbounded)
    enable_prefix_caching: bool = True
    python_hash_seed: str = "0"  # vLLM's NONE_HASH comes from PYTHONHASHSEED
    default_max_tokens: tuple[int, int] = (16, 128)  # output length range when max_tokens is unset
    embedding_dim: int = 384
    # Responses kept for `previous_response_id` (least recently used forgotten first); 0 = none.
    responses_store: int = 10_000
    # Answer vLLM's `return_token_ids` (vLLM 0.10.2 and later); False: ignore it, as older
    # vLLM releases do.
    return_token_ids: bool = True
    # A Hugging Face tokenizer.json to tokenize with instead of the built-in tokenizer, and its
    # chat template (a template file or a tokenizer_config.json; default: a tokenizer_config.json
    # beside tokenizer.json when it has one, else the built-in ChatML text).
    tokenizer: str | None = None
    chat_template: str | None = None
    timing: TimingConfig = field(default_factory=TimingConfig)
    kv_events: KvEventsConfig = field(default_factory=KvEventsConfig)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise SimConfigError("block_size must be >= 1")
        if self.num_gpu_blocks < 2:
            raise SimConfigError("num_gpu_blocks must be >= 2 (block 0 is the null block)")
        capacity = (self.num_gpu_blocks - 1) * self.block_size
        if self.max_model_len > capacity:
            raise SimConfigError(
                f"max_model_len {self.max_model_len} exceeds the KV cache capacity of {capacity} tokens; "
                "raise num_gpu_blocks or lower max_model_len"
            )
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_waiting < 1:
            raise SimConfigError("max_num_seqs, max_num_batched_tokens and max_waiting must be >= 1")
        low, high = self.default_max_tokens
        if not 1 <= low <= high:
            raise SimConfigError("default_max_tokens must be (low, high) with 1 <= low <= high")
        if self.responses_store < 0:
            raise SimConfigError("responses_store must be >= 0 (0 turns the response store off)")
        if self.chat_template is not None and self.tokenizer is None:
            raise SimConfigError("chat_template needs a tokenizer (the built-in tokenizer has its own ChatML)")

    @property
    def kv_capacity_tokens(self) -> int:
        return (self.num_gpu_blocks - 1) * self.block_size


def config_to_dict(config: EngineConfig) -> dict[str, Any]:
    return asdict(config)


def config_from_dict(data: dict[str, Any]) -> EngineConfig:
    """Inverse of `config_to_dict` (used to hand configs to a child process as JSON)."""
    values = dict(data)
    values["timing"] = TimingConfig(**values.get("timing", {}))
    values["kv_events"] = KvEventsConfig(**values.get("kv_events", {}))
    if "default_max_tokens" in values:
        low, high = values["default_max_tokens"]
        values["default_max_tokens"] = (int(low), int(high))
    return EngineConfig(**values)
