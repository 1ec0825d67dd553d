"""The `kv_cache_index` section of the router's configuration (docs/kv-scorer.md): the index,
its match groups, the cost model that scores what each backend holds, and the load view shared
between ingress processes. `RouterConfig` (config/router.py) holds it as `kv_cache_index` and
the top-level `load_sharing`."""

from __future__ import annotations

import math
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from continuum_common.config.types import Duration, KeyPrefix, Section, SourceId


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
    # ...but one that holds most of its prompt somewhere (a long shared document or system
    # prompt) stays with that holder while the holder's recent demand is at most
    # (1 + placement_tolerance) x the mean, or placement_tolerance_tokens above it, whichever
    # is more; beyond that it is copied to the least busy backend. A copy costs a full prefill
    # and cache space on every backend that holds it; balance comes first from where new
    # prefixes go.
    placement_tolerance: float = Field(0.2, ge=0.0, le=10.0)
    placement_tolerance_tokens: float = Field(80_000.0, ge=0.0, le=1e9)
    # A prompt no backend holds any of (a new document or system prompt) goes to the backend
    # with the least recent demand. False: the configured selection_strategy picks it (on
    # PrefixAwareHash, by the hash of its prefix, whatever the backend's load).
    place_new_prefixes: bool = True
    # In that measure every request routed also counts as this many new prompt tokens: a backend
    # whose requests all hit its cache still decodes them and takes their slots, and without it
    # would look idle and attract every new conversation. At 3,000 the measure follows where
    # requests go more than what they prefill, so a new document goes where its holder's
    # popular documents do not already draw the requests, and the tolerance above is about
    # 20% more requests than the mean.
    placement_request_tokens: float = Field(3000.0, ge=0.0, le=1e6)
    # Half-life of that recent-demand measure.
    demand_half_life_seconds: float = Field(60.0, gt=0.0, le=86_400.0)
    # A conversation's first turn commits its backend to the later turns, which that measure
    # counts only once they are sent. Where a conversation start or other new work goes, each
    # backend also counts the later demand still expected from the conversations started there
    # recently: per start, the new tokens that requests other than starts have recently brought
    # per start across the fleet (nothing on one-shot traffic), fading with this half-life, the
    # time over which a conversation's later turns arrive. 0 turns it off.
    commitment_half_life_seconds: float = Field(20.0, ge=0.0, le=86_400.0)
    # Cache affinity never pushes a backend beyond ceil((1 + epsilon) * mean in-flight); None
    # takes prefix_routing.load_factor_epsilon. Wider than the ring's 0.25: in-flight counts
    # are small integers, and a moved conversation recomputes its whole history, so the bound
    # is a guard against pile-ups while the cost model does the balancing.
    load_factor_epsilon: float | None = Field(1.0, ge=0.01, le=10.0)
    # Requests a backend may take beyond that bound for cache affinity: with a few requests in
    # flight the bound's rounding alone is 2 or 3, and a conversation whose home is one request
    # busier than the others would lose its history for a difference the engine barely feels.
    load_bound_slack: int = Field(2, ge=0, le=1_000)


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
    # With a local tokenizer: the part of a prompt past the last block any backend holds (in
    # the block index or this router's speculative entries) cannot change where it goes.
    # `off_path`: the prompt is encoded only as far as some backend holds it (plus the piece
    # that shows nobody holds more), routed, and the rest is encoded right after the request is
    # forwarded (what its next turn and its siblings are matched with). `on_path`: the whole
    # prompt is encoded before routing.
    tokenize_unheld_text: Literal["on_path", "off_path"] = "off_path"
    tokenize_timeout_ms: int = Field(200, ge=1, le=60_000)
    # Without a local tokenizer: block hashes of earlier /tokenize answers remembered by
    # conversation prefix (at most this many hashes, 8 bytes each), so a new turn or a request
    # sharing its first messages is matched without a call on its path. 0: every request asks.
    tokenize_memory_blocks: int = Field(1_000_000, ge=0, le=100_000_000)
    # The smallest remembered part (in tokens) a request is matched with; a request that shares
    # less with anything known asks on its path.
    tokenize_memory_min_tokens: int = Field(512, ge=0, le=1_000_000)
    # A request of which less than that is remembered (a new document, a new conversation
    # under a short system prompt, a one-off completion). `on_path`: it asks /tokenize before
    # it is routed, which also finds what the engines hold of it from traffic this router did
    # not route (other clients; what was cached before the route history's reach), at one
    # round trip on every such request. `off_path`: it is routed at once, matched as in
    # approximate mode against what was routed recently (a burst of one new prompt stays
    # together), and tokenized off its path once it has been answered, for what follows it.
    # `off_path` is the default: on production-shaped traces it kept as many hits or more at
    # less added time (docs/benchmarks.md); `on_path` suits engines other clients also warm.
    tokenize_new_prompts: Literal["on_path", "off_path"] = "off_path"
    # `on_path`: how long such a request waits for /tokenize before it goes on as an `off_path`
    # one would (approximate keys); the call then finishes off its path and what it answers is
    # remembered and recorded as held where the request went. None: it waits up to
    # `tokenize_timeout_ms` (and past that is matched approximately, the call abandoned).
    tokenize_wait_ms: int | None = Field(None, ge=0, le=60_000)
    # Without a local tokenizer, `engine: vllm`: ask each `type: vllm` backend for the token ids
    # of the prompt and of the answer with the answer itself (vLLM's `return_token_ids`, vLLM
    # 0.10.2 and later; cut out of what the client receives unless it asked for them) and learn
    # from them instead of an off-path /tokenize per request: the engine tokenizes each prompt
    # once instead of twice. A backend whose answers carry no ids (an older vLLM) is asked no
    # more after a few of them, and /tokenize is used for it (docs/kv-scorer.md). Off by
    # default: on the public conversation trace it kept 0.01 less of the ideal hit rate than
    # /tokenize in two runs (docs/benchmarks.md, "Token ids from the answer").
    token_ids_from_answers: bool = False
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


class RouteHistory(Section):
    """What the ingress replicas share (routing decisions, remembered `/tokenize` answers) is also
    kept in the JetStream stream CONTINUUM_KV_ROUTES, so an ingress process that starts (a
    restart, a new replica) replays it and routes as its predecessors did (docs/kv-scorer.md,
    "After a restart"). Needs `share_decisions`."""

    enabled: bool = True
    # Limits of the stream when this ingress creates it (an existing stream is left as it is):
    # older decisions matter no more (approximate records live `approximate.ttl_seconds`,
    # recent demand halves every minute).
    max_age: Duration = Field(600.0, gt=0.0, le=7 * 86_400.0)
    max_bytes: int = Field(256 << 20, ge=1 << 20, le=1 << 40)
    # The replay runs beside the traffic; it gives up after this long (counted).
    replay_timeout: Duration = Field(30.0, gt=0.0, le=3_600.0)


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
    route_history: RouteHistory = RouteHistory()
    # GET /readyz answers 503 (starting) until the index has been fed (memory: the stream's
    # recent history replayed) and the route history replayed, at most this long after the
    # ingress started serving (NATS down at start: ready after it all the same). 0: at once.
    ready_timeout: Duration = Field(10.0, ge=0.0, le=600.0)
    # Read the answer each chat request got (OpenAI chat completions, Anthropic Messages,
    # Responses requests that resend their conversation) and remember its conversation with
    # that answer where it was routed, so its next turn is matched through the answer (precise
    # groups without a local tokenizer: the token ids returned with the answer, or one
    # off-path /tokenize per turn, of the conversation with its answer, instead of its own
    # messages; approximate: the answer's text chunks).
    # false: no answer is read.
    learn_answers: bool = True
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
