"""The router's configuration file (`continuum-router`, gemini-cache and indexer read it too).

Sections and defaults follow the seed's configuration reference; `bus`, `redis`, `admin`,
`tracing` and `server` are Continuum's additions (DESIGN.md §4). Every range the seed states is
enforced here, so a bad value fails at load time with its dotted path, never at request time.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from continuum_common.config.kv_index import (
    KvCacheIndex,
    LoadSharing,
    MatchGroup,
)
from continuum_common.config.types import (
    Duration,
    HttpUrl,
    InboxPrefix,
    KeyPrefix,
    NatsUrl,
    RedisUrl,
    Section,
    SourceId,
)


class PrefixRouting(Section):
    enabled: bool = False
    max_prefix_length: int = Field(1024, ge=1, le=1_048_576)
    load_factor_epsilon: float = Field(0.25, ge=0.01, le=10.0)
    virtual_nodes: int = Field(150, ge=1, le=10_000)
    anthropic_cache_control_injection: bool = False


class ResponseAffinity(Section):
    """OpenAI Responses requests that continue a stored response (`previous_response_id`) go to
    the backend that produced it: engines such as vLLM keep their stored responses in their own
    process, so any other backend answers 404 (and holds none of the conversation's KV cache)."""

    enabled: bool = True
    max_entries: int = Field(100_000, ge=1, le=10_000_000)
    ttl: Duration = 86_400.0
    # An id this process never saw (another replica or worker answered it, or it was
    # forgotten): try the candidates in turn while they answer 404 for it.
    probe: bool = True
    max_probes: int = Field(8, ge=1, le=64)


class TlsFiles(Section):
    """Client-side TLS: `ca_file` verifies the server (None: the system's trust store);
    `cert_file` + `key_file` are this client's certificate for servers that require one."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @model_validator(mode="after")
    def _cert_and_key(self) -> Self:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("@key_file: cert_file and key_file must be set together")
        return self


class RedisConnection(Section):
    """Connection fields shared by `redis` and the seed's `response_cache.redis`."""

    url: RedisUrl = "redis://127.0.0.1:6379"
    # true (or a `rediss://` url): TLS verified against the system's trust store; a mapping
    # names the CA and the client certificate.
    tls: bool | TlsFiles = False
    # ACL user (Redis 6+); None authenticates as `default` (password only).
    username: str | None = None
    pool_size: int = Field(16, ge=1, le=1024)
    connect_timeout_ms: int = Field(3000, ge=1, le=600_000)
    command_timeout_ms: int = Field(1000, ge=1, le=600_000)
    # A pooled connection idle for longer than this sends PING before its next command, so a
    # connection a restarted Redis (or a NAT/load balancer) dropped is replaced before use.
    # 0 disables the check.
    health_check_interval_ms: int = Field(15_000, ge=0, le=3_600_000)
    socket_keepalive: bool = True
    password_env: str | None = None
    password_file: str | None = None

    def tls_files(self) -> TlsFiles | None:
        """The TLS settings when the connection uses TLS (`tls` set or a `rediss://` url)."""
        if isinstance(self.tls, TlsFiles):
            return self.tls
        if self.tls or self.url.startswith("rediss://"):
            return TlsFiles()
        return None


class ResponseCacheRedis(RedisConnection):
    pool_size: int = Field(8, ge=1, le=1024)
    key_prefix: KeyPrefix = "cr:resp:"
    fallback_capacity: int = Field(1000, ge=1, le=10_000_000)
    fallback_ttl_seconds: int = Field(300, ge=1, le=86_400 * 30)
    fallback_to_memory: bool = True


class SemanticCache(Section):
    enabled: bool = False
    backend: str | None = None
    embedding_model: str | None = None
    # The seed falls back to the Hub's semantic_similarity_bps when omitted; there is no Hub
    # here, so an omitted threshold means 0.92 (documented in docs/configuration.md).
    threshold: float = Field(0.92, ge=0.0, le=1.0)
    max_entries: int = Field(1000, ge=1, le=1_000_000)
    ttl: Duration | None = None
    embedding_timeout_ms: int = Field(2000, ge=100, le=60_000)
    max_input_bytes: int = Field(8192, ge=1, le=1_048_576)

    @field_validator("ttl")
    @classmethod
    def _ttl_positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("ttl must be positive")
        return value

    @model_validator(mode="after")
    def _required_when_enabled(self) -> Self:
        if self.enabled:
            missing = [f for f in ("backend", "embedding_model") if not getattr(self, f)]
            if missing:
                raise ValueError("\n".join(f"@{f}: required when the semantic cache is enabled" for f in missing))
        return self


class ResponseCacheConfig(Section):
    enabled: bool = False
    backend: Literal["memory", "redis"] = "memory"
    capacity: int = Field(1000, ge=1, le=100_000_000)
    ttl: Duration = 300.0
    max_response_size: int = Field(1_048_576, ge=1, le=1 << 30)
    max_stream_buffer_size: int = Field(10_485_760, ge=1, le=1 << 30)
    # Streaming responses are cached only when buffering is on (seed: "스트리밍 버퍼링").
    stream_buffering: bool = True
    # Tenant isolation: by default the tenant is a digest of the caller's API key; a trusted
    # front proxy can name the tenant in this header instead.
    tenant_header: str | None = None
    # A request that omits `temperature` samples at the provider's default (1.0 for OpenAI and
    # Anthropic), so by default it is not cached; true caches it as if it were 0 (for clients
    # that never send the field but want repeated prompts answered from the cache).
    cache_omitted_temperature: bool = False
    redis: ResponseCacheRedis | None = None
    semantic: SemanticCache = SemanticCache()

    @field_validator("ttl")
    @classmethod
    def _ttl_positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("ttl must be positive")
        return value


class GeminiContextCacheConfig(Section):
    enabled: bool = False
    min_prefix_bytes: int = Field(16_384, ge=1024)
    ttl: Duration = 600.0
    extend_on_hit: bool = False
    max_entries: int = Field(1000, ge=10, le=1_000_000)
    create_timeout_ms: int = Field(5000, ge=500, le=60_000)
    negative_ttl_seconds: int = Field(600, ge=1)
    prefer_native_api: bool = False
    key_prefix: KeyPrefix = "cr:gem:"
    # How long the ingress remembers a lookup answer locally before asking again.
    lookup_memo_ms: int = Field(2000, ge=0, le=60_000)
    lookup_timeout_ms: int = Field(50, ge=1, le=10_000)

    @field_validator("ttl")
    @classmethod
    def _ttl_at_least_a_minute(cls, value: float) -> float:
        if value < 60:
            raise ValueError("ttl must be at least 60s (Google's minimum)")
        return value


class SelectionStrategy(StrEnum):
    ROUND_ROBIN = "RoundRobin"
    WEIGHTED_ROUND_ROBIN = "WeightedRoundRobin"
    LEAST_LATENCY = "LeastLatency"
    RANDOM = "Random"
    CONSISTENT_HASH = "ConsistentHash"
    PREFIX_AWARE_HASH = "PrefixAwareHash"


BackendType = Literal["openai", "vllm", "sglang", "trtllm", "anthropic", "gemini"]


class Backend(Section):
    name: SourceId
    url: HttpUrl
    type: BackendType = "openai"
    models: list[str] = []
    weight: int = Field(1, ge=1, le=10_000)
    enabled: bool = True
    # internal backends serve the router itself (embeddings for the semantic cache) and are
    # never chosen for client traffic.
    internal: bool = False
    anthropic_auto_cache_control: bool = True
    api_key_env: str | None = None
    api_key_file: str | None = None
    connect_timeout_ms: int = Field(2000, ge=1, le=600_000)
    request_timeout_ms: int = Field(600_000, ge=1, le=3_600_000)
    # Streams: the first body byte (the first token) must come within first_byte_timeout_ms of
    # sending, later bytes within stream_idle_timeout_ms of each other (docs/ingress.md).
    first_byte_timeout_ms: int = Field(60_000, ge=1, le=3_600_000)
    stream_idle_timeout_ms: int = Field(60_000, ge=1, le=3_600_000)
    max_connections: int = Field(256, ge=1, le=100_000)
    health_check_path: str | None = None
    health_check_interval_ms: int = Field(5000, ge=100, le=600_000)

    @model_validator(mode="before")
    @classmethod
    def _no_inline_secret(cls, data: object) -> object:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError(
                "@api_key: inline secrets are refused; name an env var (api_key_env) or a file (api_key_file)"
            )
        return data

    @model_validator(mode="after")
    def _one_key_source(self) -> Self:
        if self.api_key_env and self.api_key_file:
            raise ValueError("@api_key_file: set api_key_env or api_key_file, not both")
        return self


class BusTls(TlsFiles):
    # The name the server's certificate must carry when it differs from the url's host.
    server_name: str | None = None


class BusStream(Section):
    max_age: Duration = 3600.0
    max_bytes: int = Field(1 << 30, ge=1 << 20)
    duplicate_window: Duration = 120.0
    replicas: int = Field(1, ge=1, le=5)


class Bus(Section):
    """NATS connection. With `embedded: true` (the default), `continuum-router up` starts its own
    nats-server with JetStream in `data_dir` and ignores `url`."""

    embedded: bool = True
    url: NatsUrl = "nats://127.0.0.1:4222"
    data_dir: str | None = None
    embedded_port: int = Field(0, ge=0, le=65535)
    user: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    token_env: str | None = None
    token_file: str | None = None
    creds_file: str | None = None
    tls: BusTls | None = None
    # Prefix of this client's reply subjects (`_INBOX` when unset). A per-user prefix lets the
    # server's permissions limit each user to reading its own replies.
    inbox_prefix: InboxPrefix | None = None
    connect_timeout_ms: int = Field(2000, ge=1, le=600_000)
    request_timeout_ms: int = Field(1000, ge=1, le=600_000)
    stream: BusStream = BusStream()


class Redis(RedisConnection):
    """The shared Redis/Valkey connection (response cache, KV index, gemini-cache state)."""

    cluster: bool = False


class Admin(Section):
    """Admin endpoints require `Authorization: Bearer <token>`; with no token configured they
    answer 401 to everyone (locked, never open)."""

    token_env: str | None = None
    token_file: str | None = None


class TracingConfig(Section):
    enabled: bool = False
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = "continuum"
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)


class Server(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024, le=1 << 30)
    workers: int = Field(1, ge=1, le=256)
    # The HTTP edge (docs/configuration.md, "server"): request-head size, slow-client timeouts
    # and the per-client connection cap (0: no cap).
    max_header_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    header_timeout: Duration = 10.0
    body_timeout: Duration = 30.0
    keepalive_timeout: Duration = 30.0
    max_connections_per_client: int = Field(1024, ge=0, le=1_000_000)
    # With several workers: hand idle keep-alive connections from a worker above the fair share
    # to one below it, every `rebalance_interval` (docs/ingress.md, "Workers"). Off by default:
    # meant for hosts where each worker has a core of its own; on a machine whose cores the
    # workers share with other busy processes it measured slower (docs/benchmarks.md).
    rebalance_connections: bool = False
    rebalance_interval: Duration = 0.25

    @model_validator(mode="after")
    def _positive_timeouts(self) -> Self:
        for key in ("header_timeout", "body_timeout", "keepalive_timeout", "rebalance_interval"):
            if getattr(self, key) <= 0:
                raise ValueError(f"@{key}: must be greater than zero")
        return self


class RouterConfig(Section):
    server: Server = Server()
    prefix_routing: PrefixRouting = PrefixRouting()
    response_affinity: ResponseAffinity = ResponseAffinity()
    response_cache: ResponseCacheConfig = ResponseCacheConfig()
    kv_cache_index: KvCacheIndex = KvCacheIndex()
    gemini_context_cache: GeminiContextCacheConfig = GeminiContextCacheConfig()
    selection_strategy: SelectionStrategy = SelectionStrategy.ROUND_ROBIN
    backends: list[Backend] = []
    bus: Bus = Bus()
    redis: Redis | None = None
    admin: Admin = Admin()
    tracing: TracingConfig = TracingConfig()
    # None: kv_cache_index.load_sharing when set there, else the defaults (`shared_load()`).
    load_sharing: LoadSharing | None = None

    def shared_load(self) -> LoadSharing:
        """The effective load-sharing settings (top level, else kv_cache_index's, else defaults)."""
        return self.load_sharing or self.kv_cache_index.load_sharing or LoadSharing()

    @model_validator(mode="after")
    def _cross_section_rules(self) -> Self:
        # Errors that span sections carry their own dotted path in the message, because
        # pydantic would otherwise attach them to the root of the document.
        problems: list[str] = []
        names = [b.name for b in self.backends]
        for dupe in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"@backends: name {dupe!r} is used more than once")
        sem = self.response_cache.semantic
        if sem.enabled and sem.backend is not None:
            target = next((b for b in self.backends if b.name == sem.backend), None)
            if target is None:
                problems.append(f"@response_cache.semantic.backend: {sem.backend!r} is not a configured backend")
            elif not target.enabled:
                problems.append(f"@response_cache.semantic.backend: {sem.backend!r} is disabled (enabled: false)")
        problems.extend(self._group_problems())
        if self.load_sharing is not None and self.kv_cache_index.load_sharing is not None:
            problems.append("@load_sharing: is also set as kv_cache_index.load_sharing (its older place); keep one")
        needs_redis = [
            path
            for path, backend in (
                ("response_cache.backend", self.response_cache.backend if self.response_cache.enabled else ""),
                ("kv_cache_index.backend", self.kv_cache_index.backend if self.kv_cache_index.enabled else ""),
            )
            if backend == "redis"
        ]
        if needs_redis and self.redis_connection() is None:
            problems.extend(
                f"@{path}: is redis but no connection is configured (set redis.url or response_cache.redis.url)"
                for path in needs_redis
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _group_problems(self) -> list[str]:
        known = {b.name for b in self.backends}
        owner: dict[str, str] = {}
        problems: list[str] = []
        for i, group in enumerate(self.kv_cache_index.groups):
            for name in group.backends:
                if name not in known:
                    problems.append(f"@kv_cache_index.groups.{i}.backends: {name!r} is not a configured backend")
            for b in self.backends:
                if b.name in group.backends or set(b.models) & set(group.models):
                    if b.name in owner and owner[b.name] != group.name:
                        problems.append(
                            f"@kv_cache_index.groups.{i}: backend {b.name!r} is already in group {owner[b.name]!r}"
                        )
                    owner.setdefault(b.name, group.name)
        return problems

    def match_group_of(self, backend: str) -> MatchGroup | None:
        """The match group a backend belongs to (by name, then by a model it serves)."""
        spec = next((b for b in self.backends if b.name == backend), None)
        for group in self.kv_cache_index.groups:
            if backend in group.backends or (spec is not None and set(spec.models) & set(group.models)):
                return group
        return None

    def redis_connection(self) -> Redis | ResponseCacheRedis | None:
        """The Redis connection every component shares: the top-level `redis` section, else the
        seed's `response_cache.redis` (kept for compatibility), else None."""
        return self.redis or self.response_cache.redis
