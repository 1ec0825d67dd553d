"""The router's configuration file (`continuum-router`, gemini-cache and indexer read it too).

Sections and defaults follow the seed's configuration reference; `bus`, `redis`, `admin`,
`tracing` and `server` are Continuum's additions (DESIGN.md §4). Every range the seed states is
enforced here, so a bad value fails at load time with its dotted path, never at request time.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

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


class CostModel(Section):
    """Parameters of the default scorer (`scoring.model: cost`, docs/kv-scorer.md): estimated
    time to first token on each candidate, under the CHWBL load bound."""

    # Uncached prompt tokens one backend prefills per second (sets the weight of the queue
    # against the in-flight term; only ratios matter for the choice).
    prefill_tokens_per_second: float = Field(10_000.0, gt=0.0, le=1e9)
    # Extra delay each request already running on the backend adds to a new request's first
    # token (decode steps interleaved with the prefill), in milliseconds.
    per_request_ms: float = Field(2.0, ge=0.0, le=60_000.0)
    # A token held only in a storage tier costs this fraction of recomputing it (the copy back).
    storage_token_cost: float = Field(0.25, ge=0.0, le=1.0)
    # Each prompt token a candidate does not hold costs its prefill time plus this fraction
    # again: computing it there also writes a second copy of context another backend already
    # caches (displacing other prefixes), and the conversation's next turns follow it. 0 is
    # pure time to first token; higher values keep conversations home under heavier load
    # (on the public conversation trace 3 kept 0.95-0.98 of the ideal hit rate, 10 0.97-0.99,
    # 30 0.997, at the same TTFT; the load bound still moves work off an overloaded home).
    miss_penalty: float = Field(30.0, ge=0.0, le=100.0)
    # The same charge in the placement of new work (below), where it weighs what a candidate
    # does not hold of a new conversation (its system prompt) against recent demand: higher
    # values keep new conversations with their system prompt's holder at the cost of balance.
    placement_miss_penalty: float = Field(3.0, ge=0.0, le=100.0)
    # A request whose best candidate holds less than this fraction of its prompt is new work
    # (a new conversation under a shared system prompt): it goes where the least new prompt
    # was sent recently, so conversations spread over every backend's cache, instead of to
    # whoever holds its small shared head.
    affinity_threshold: float = Field(0.3, ge=0.0, le=1.0)
    # The first turn of a chat conversation (no earlier answer in its messages) is new work
    # too, whatever it holds: its backend is where every later turn goes.
    place_conversation_starts: bool = True
    # In that measure every request routed also counts as this many new prompt tokens: a backend
    # whose requests all hit its cache still decodes them and takes their slots, and without it
    # would look idle and attract every new conversation.
    placement_request_tokens: float = Field(256.0, ge=0.0, le=1e6)
    # Half-life of that recent-demand measure.
    demand_half_life_seconds: float = Field(60.0, gt=0.0, le=86_400.0)
    # Cache affinity never pushes a backend beyond ceil((1 + epsilon) * mean in-flight); None
    # takes prefix_routing.load_factor_epsilon. Wider than the ring's 0.25: in-flight counts
    # are small integers, and a moved conversation recomputes its whole history, so the bound
    # is a guard against pile-ups while the cost model does the balancing.
    load_factor_epsilon: float | None = Field(1.0, ge=0.01, le=10.0)
    # Requests a backend may take beyond that bound for cache affinity: with a few requests in
    # flight the bound's rounding alone is 2 or 3, and a conversation whose home is one request
    # busier than the others would lose its history for a difference the engine barely feels.
    load_bound_slack: int = Field(1, ge=0, le=1_000)


class Scoring(Section):
    # `cost` (default): longest matched prefix per backend against its load, as estimated time
    # to first token under the CHWBL bound. `seed`: the seed's composite formula below.
    model: Literal["cost", "seed"] = "cost"
    overlap_weight: float = Field(0.6, ge=0.0, le=1.0)
    load_weight: float = Field(0.3, ge=0.0, le=1.0)
    health_weight: float = Field(0.1, ge=0.0, le=1.0)
    min_overlap_threshold: float = Field(0.3, ge=0.0, le=1.0)
    gpu_tier_weight: float = Field(1.0, ge=0.0, le=10.0)
    storage_tier_weight: float = Field(0.6, ge=0.0, le=10.0)
    cost: CostModel = CostModel()

    @model_validator(mode="before")
    @classmethod
    def _model_shorthand(cls, data: object) -> object:
        # `scoring: seed` / `scoring: cost` is accepted for `scoring: {model: ...}`.
        if isinstance(data, str):
            return {"model": data}
        return data

    @model_validator(mode="after")
    def _weights_sum_to_one(self) -> Self:
        total = self.overlap_weight + self.load_weight + self.health_weight
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(
                f"@overlap_weight: overlap_weight + load_weight + health_weight must sum to 1.0 (got {total:g})"
            )
        return self


class StorageOffloading(Section):
    enabled: bool = False
    treat_eviction_as_offload: bool = True


class EventSource(Section):
    backend_name: SourceId
    endpoint: str | None = None
    # "sse" pulls the listener's GET /events/{backend}; "event_bus" (alias "nats") takes the
    # events from the NATS JetStream stream instead, which is Continuum's push mode.
    transport: Literal["sse", "event_bus", "nats"] = "sse"
    reconnect_interval_ms: int = Field(5000, ge=10, le=600_000)

    @model_validator(mode="after")
    def _endpoint_matches_transport(self) -> Self:
        if self.transport == "sse":
            if not self.endpoint:
                raise ValueError("@endpoint: required unless transport is event_bus")
            parts = urlsplit(self.endpoint)
            if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
                raise ValueError(f"@endpoint: {self.endpoint!r} must use http, https, ws or wss and name a host")
        elif self.endpoint:
            raise ValueError(f"@endpoint: must be omitted when transport is {self.transport}")
        return self


class SaltEchoConfig(Section):
    """Salt echo (continuum_common.salt): the ingress sends vLLM/TRT-LLM backends a `cache_salt`
    carrying an HMAC-authenticated prefix key so the listener can map chains without
    detokenizing. The secret must equal the listener's `salt` secret."""

    enabled: bool = False
    secret_env: str | None = None
    secret_file: str | None = None

    @model_validator(mode="after")
    def _needs_secret(self) -> Self:
        if self.enabled and not (self.secret_env or self.secret_file):
            raise ValueError("@secret_env: salt echo is enabled but no secret_env or secret_file is set")
        return self


MatchMode = Literal["precise", "approximate", "prefix_key"]


class ApproximateMatching(Section):
    """`mode: approximate`: the rendered conversation in fixed-size text chunks, chained hashes,
    recorded per backend when a request is routed there (no tokenizer, no engine events)."""

    chunk_bytes: int = Field(256, ge=16, le=65_536)
    # How long a routed prefix is assumed to stay cached without being routed again.
    ttl_seconds: int = Field(600, ge=1, le=86_400)
    # Tokens each backend is assumed to cache; the least recently routed chunks beyond it are
    # forgotten. None: learn it from the backend's KV events where they exist, else unbounded
    # (TTL only).
    capacity_tokens: int | None = Field(None, ge=1, le=1 << 40)
    # Bytes per token when no tokenizer counts them (the load model's prompt-length estimate).
    bytes_per_token: float = Field(4.0, gt=0.0, le=64.0)


class LoadSharing(Section):
    """The shared load view (docs/ingress.md, "Workers"; docs/kv-scorer.md, "One load view"):
    each ingress process publishes its per-backend in-flight requests and queued prefill tokens
    and adds the other processes' latest reports to its own counts. Between the workers of one
    `serve` the reports travel over Unix datagram sockets; between replicas, over NATS."""

    enabled: bool = True
    interval_ms: int = Field(100, ge=10, le=10_000)
    # A replica not heard from for this long is forgotten (its load no longer counted).
    stale_after_ms: int = Field(1_000, ge=50, le=600_000)
    # Over NATS: `auto` while KV routing is on (on its connection), `always` also without it (on
    # a connection of its own to bus.url), `never` only between the workers of one `serve`.
    bus: Literal["auto", "always", "never"] = "auto"

    @model_validator(mode="after")
    def _stale_after_interval(self) -> Self:
        if self.stale_after_ms < 2 * self.interval_ms:
            raise ValueError("@stale_after_ms: must be at least twice interval_ms")
        return self


class MatchGroup(Section):
    """Backends that share a tokenizer and a block hashing scheme, and how the ingress turns a
    request into block hashes for them (docs/kv-scorer.md, "Matching modes")."""

    name: SourceId
    # Members: the named backends, plus every backend serving one of `models`.
    backends: list[str] = []
    models: list[str] = []
    mode: MatchMode = "approximate"
    # precise mode: the engine whose block hashes the ingress recomputes.
    engine: Literal["vllm", "sglang", "trtllm"] = "vllm"
    block_size: int = Field(16, ge=1, le=4096)
    # vLLM's PYTHONHASHSEED (its NONE_HASH seed). Required for precise vLLM groups: without it
    # vLLM seeds its hashes randomly and no one else can recompute them.
    hash_seed: str | None = None
    vllm_hash_algo: Literal["sha256_cbor", "sha256"] = "sha256_cbor"
    # Local tokenizer: a Hugging Face tokenizer.json and a Jinja2 chat template (a file with the
    # template text, or a tokenizer_config.json carrying `chat_template`). Without `tokenizer`,
    # precise mode asks the backend's `tokenize_path` for the token ids.
    tokenizer: str | None = None
    chat_template: str | None = None
    tokenize_path: str = "/tokenize"
    tokenize_timeout_ms: int = Field(200, ge=1, le=60_000)
    # Without a local tokenizer: block hashes of earlier /tokenize answers remembered by
    # conversation prefix (at most this many hashes, 8 bytes each), so a new turn or a request
    # sharing its first messages is matched without a call on its path. 0: every request asks.
    tokenize_memory_blocks: int = Field(1_000_000, ge=0, le=100_000_000)
    # The smallest remembered part (in tokens) a request is matched with; a request that shares
    # less with anything known asks on its path.
    tokenize_memory_min_tokens: int = Field(512, ge=0, le=1_000_000)
    approximate: ApproximateMatching = ApproximateMatching()

    @model_validator(mode="after")
    def _members_and_seed(self) -> Self:
        if not self.backends and not self.models:
            raise ValueError("@backends: a match group needs backends or models")
        if self.mode == "precise" and self.engine == "vllm" and self.hash_seed is None:
            raise ValueError("@hash_seed: precise matching of vLLM needs the engines' PYTHONHASHSEED")
        if self.chat_template and not self.tokenizer:
            raise ValueError("@chat_template: needs a tokenizer")
        return self


class KvCacheIndex(Section):
    enabled: bool = False
    backend: Literal["memory", "redis"] = "memory"
    max_entries: int = Field(100_000, ge=100, le=10_000_000)
    entry_ttl_seconds: int = Field(600, ge=1, le=86_400)
    key_prefix: KeyPrefix = "cr:kvidx:"
    # Provisional entries recorded right after a routing decision so a burst with a new prefix
    # sticks before the engine's event arrives (and, over NATS, on every ingress replica).
    # 0 disables.
    speculative_ttl_ms: int = Field(10_000, ge=0, le=600_000)
    # How requests are matched against what each backend holds, per group of backends; a
    # backend in no group uses `default_mode` (with approximate settings of `approximate`).
    default_mode: MatchMode = "approximate"
    approximate: ApproximateMatching = ApproximateMatching()
    groups: list[MatchGroup] = []
    # Share routing decisions (speculative entries, approximate records) and remembered
    # /tokenize answers with the other ingress replicas over NATS.
    share_decisions: bool = True
    # The older place of the top-level `load_sharing` section (still accepted; not both).
    load_sharing: LoadSharing | None = None
    scoring: Scoring = Scoring()
    storage_offloading: StorageOffloading = StorageOffloading()
    salt_echo: SaltEchoConfig = SaltEchoConfig()
    event_sources: list[EventSource] = []

    @model_validator(mode="after")
    def _unique_sources(self) -> Self:
        problems: list[str] = []
        names = [s.backend_name for s in self.event_sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"@event_sources: {', '.join(dupes)} is listed more than once")
        if self.default_mode == "precise":
            problems.append("@default_mode: precise matching needs a group's hashing parameters; use a group")
        groups = [g.name for g in self.groups]
        problems.extend(
            f"@groups: name {n!r} is used more than once" for n in sorted({n for n in groups if groups.count(n) > 1})
        )
        if problems:
            raise ValueError("\n".join(problems))
        return self


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

    @model_validator(mode="after")
    def _positive_timeouts(self) -> Self:
        for key in ("header_timeout", "body_timeout", "keepalive_timeout"):
            if getattr(self, key) <= 0:
                raise ValueError(f"@{key}: must be greater than zero")
        return self


class RouterConfig(Section):
    server: Server = Server()
    prefix_routing: PrefixRouting = PrefixRouting()
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
