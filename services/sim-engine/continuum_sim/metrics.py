"""Per-engine Prometheus metrics: vLLM's names for what vLLM exports, `continuum_sim_*` for the rest.

Each engine owns its CollectorRegistry (several engines share one process). Labels follow vLLM v1:
`model_name` and `engine` (the DP engine index, always "0" here).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)


class EngineMetrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("model_name", "engine")
        values = (model, "0")
        r = self.registry

        self.running = Gauge(
            "vllm:num_requests_running", "Requests in model execution batches.", labels, registry=r
        ).labels(*values)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be processed.", labels, registry=r
        ).labels(*values)
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=r
        ).labels(*values)
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels,
            registry=r,
        ).labels(*values)
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels, registry=r
        ).labels(*values)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r
        ).labels(*values)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        ).labels(*values)
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemptions.", labels, registry=r
        ).labels(*values)
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=r,
        )
        self._model = values
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token (simulated seconds).", labels,
            buckets=_LATENCY_BUCKETS, registry=r,
        ).labels(*values)  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency (simulated seconds).", labels,
            buckets=_E2E_BUCKETS, registry=r,
        ).labels(*values)  # fmt: skip
        # Before the engine's clock starts: what a router's "added" time must not be charged with.
        self.front = Histogram(
            "continuum_sim_request_front_seconds",
            "Real seconds from a generation request's arrival (its body read) to its submission to"
            " the scheduler (rendering the chat template, tokenizing).",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        # The engine's TTFT ends when its step produced the token; this ends when the HTTP layer
        # handed the first chunk to the server, after whatever else this process was doing.
        self.first_chunk = Histogram(
            "continuum_sim_first_chunk_seconds",
            "Real seconds from a streamed generation request's arrival (its body read) to its first"
            " chunk handed to the HTTP server.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._simulator_metrics(r)

    def _simulator_metrics(self, r: CollectorRegistry) -> None:
        self.events_published = Counter(
            "continuum_sim_kv_event_batches_published", "KV event batches sent on the PUB socket.", registry=r
        )
        self.replay_requests = Counter(
            "continuum_sim_kv_replay_requests",
            "Replay requests on the ROUTER socket by result.",
            ("result",),
            registry=r,
        )
        self.replay_evicted = Counter(
            "continuum_sim_kv_replay_buffer_evicted",
            "Batches dropped from the replay buffer (steps or bytes bound).",
            registry=r,
        )
        self.rejected = Counter(
            "continuum_sim_requests_rejected", "Requests refused before scheduling, by reason.", ("reason",), registry=r
        )
        self.aborted = Counter("continuum_sim_requests_aborted", "Requests aborted (client went away).", registry=r)
        self.cached_hashes = Gauge(
            "continuum_sim_cached_block_hashes",
            "Distinct block hashes resident in the prefix cache: what a KV index of this engine should hold.",
            registry=r,
        )
        self.step_lag = Gauge(
            "continuum_sim_step_lag_seconds",
            "How far the step loop runs behind its scaled schedule (real seconds).",
            registry=r,
        )

    def success(self, finished_reason: str) -> None:
        self._success.labels(*self._model, finished_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
