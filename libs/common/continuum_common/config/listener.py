"""The KV listener's own file, `config.kv-listener.yaml` (seed §Tier 4).

The seed's push-mode `event_bus` section becomes a NATS connection here (DESIGN.md §5): the
listener dials out to NATS, so nothing has to dial into a GPU cluster. `event_bus` is accepted
as another name for `bus`.
"""

from __future__ import annotations

from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from continuum_common.config.router import Bus, TracingConfig
from continuum_common.config.types import HttpUrl, Section, SourceId

ChatTemplate = Literal["chatml", "llama3", "mistral", "gemma", "sim"]
# What a source publishes: version-2 block batches (the engine's block hashes, one bus message
# per engine batch), version-1 prefix-key events (the seed's index, and the SSE feed), or both.
PublishMode = Literal["blocks", "prefix", "both"]


class ListenerSource(Section):
    backend_name: SourceId
    engine: Literal["vllm", "sglang", "trtllm"]
    publish: PublishMode = "blocks"
    model: str | None = None
    # ZMQ (vLLM, SGLang)
    zmq_endpoint: str | None = None
    zmq_mode: Literal["bind", "connect"] = "connect"
    topic: str = ""
    replay_endpoint: str | None = None
    # Receive high-water mark of the SUB socket, in batches (vLLM's publisher default).
    zmq_rcvhwm: int = Field(100_000, ge=1, le=10_000_000)
    # TensorRT-LLM: the trtllm-serve POST /kv_cache_events drain
    trtllm_endpoint: HttpUrl | None = None
    poll_interval_ms: int = Field(200, ge=10, le=60_000)
    # Prefix-key recovery: salt echo (HMAC-authenticated key in cache_salt) or detokenize.
    prefix_key_mode: Literal["salt_echo", "detokenize", "auto"] = "auto"
    detokenize_endpoint: HttpUrl | None = None
    chat_template: ChatTemplate = "chatml"
    block_size: int | None = Field(None, ge=1, le=65_536)
    allowed_publishers: list[str] = []
    request_timeout_ms: int = Field(2000, ge=10, le=60_000)

    @property
    def publishes_blocks(self) -> bool:
        return self.publish != "prefix"

    @property
    def publishes_prefix(self) -> bool:
        return self.publish != "blocks"

    @model_validator(mode="after")
    def _transport_fields(self) -> Self:
        if self.engine in ("vllm", "sglang"):
            if not self.zmq_endpoint:
                raise ValueError(f"@zmq_endpoint: required for engine {self.engine}")
            if urlsplit(self.zmq_endpoint).scheme not in ("tcp", "ipc", "inproc"):
                raise ValueError("@zmq_endpoint: must be a tcp://, ipc:// or inproc:// endpoint")
            if self.trtllm_endpoint:
                raise ValueError("@trtllm_endpoint: only for engine trtllm")
        else:
            if not self.trtllm_endpoint:
                raise ValueError("@trtllm_endpoint: required for engine trtllm")
            host = urlsplit(self.trtllm_endpoint).hostname
            if host not in self.allowed_publishers:
                raise ValueError(f"@allowed_publishers: must list the trtllm_endpoint host {host!r}")
            if self.prefix_key_mode == "detokenize":
                raise ValueError("@prefix_key_mode: trtllm-serve has no /detokenize; use salt_echo")
        if self.zmq_mode == "bind" and self.engine != "trtllm" and not self.allowed_publishers:
            raise ValueError("@allowed_publishers: required when zmq_mode is bind")
        if self.prefix_key_mode == "detokenize" and not self.detokenize_endpoint:
            raise ValueError("@detokenize_endpoint: required when prefix_key_mode is detokenize")
        return self


class ListenerLimits(Section):
    max_chain_tokens: int = Field(16_384, ge=1, le=1 << 24)
    max_tracked_blocks: int = Field(100_000, ge=1, le=100_000_000)
    max_retained_tokens: int = Field(16_777_216, ge=1, le=1 << 31)
    coalesce_window_ms: int = Field(50, ge=0, le=10_000)
    publish_buffer: int = Field(10_000, ge=1, le=10_000_000)
    sse_history: int = Field(10_000, ge=1, le=10_000_000)
    detokenize_concurrency: int = Field(4, ge=1, le=256)
    # A block stream that published nothing for this long gets an empty batch (liveness).
    keepalive_ms: int = Field(60_000, ge=100, le=3_600_000)
    # JetStream publishes awaiting their acknowledgement at once.
    max_outstanding_acks: int = Field(128, ge=1, le=65_536)


class ListenerSalt(Section):
    """Shared HMAC secret for salt echo; must equal the ingress's."""

    secret_env: str | None = None
    secret_file: str | None = None


class ListenerConfig(Section):
    listen: str = "127.0.0.1:7817"
    bus: Bus | None = Field(default=None, validation_alias="event_bus")
    max_prefix_length: int = Field(1024, ge=1, le=1_048_576)
    salt: ListenerSalt = ListenerSalt()
    limits: ListenerLimits = ListenerLimits()
    tracing: TracingConfig = TracingConfig()
    sources: list[ListenerSource] = []

    @model_validator(mode="before")
    @classmethod
    def _bus_alias(cls, data: object) -> object:
        if isinstance(data, dict) and "bus" in data:
            if "event_bus" in data:
                raise ValueError("@event_bus: set bus or event_bus, not both")
            data = {**data, "event_bus": data["bus"]}
            del data["bus"]
        return data

    @model_validator(mode="after")
    def _checks(self) -> Self:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"@listen: {self.listen!r} must be host:port")
        names = [s.backend_name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"@sources: backend_name {', '.join(dupes)} is used more than once")
        return self
