"""The KV scorer's own metrics, registered on the ingress app's registry.

The routing decision counter and the overlap histogram (`continuum_kv_index_routing_decisions
_total`, `continuum_kv_index_overlap_score`) belong to the selection pipeline (metrics.py); in
embedded memory mode the indexer's consumer metrics (`continuum_kv_event_dropped_total`,
`continuum_kv_consumer_connected`, ...) are registered by continuum_indexer.embedded on the same
registry. This module adds only what the scorer itself measures; no name is registered twice.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

QUERY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


KEYS_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class KvScorerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        speculative_entries: Callable[[], float],
        recorded_entries: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._selector_metrics(registry, recorded_entries)
        self._prefix_scorer_metrics(registry, speculative_entries)

    def _selector_metrics(self, r: CollectorRegistry, recorded_entries: Callable[[], float]) -> None:
        self.keys_seconds = Histogram(
            "continuum_kv_request_keys_seconds",
            "Time to turn a request into its matching keys (tokenize + hash, or text chunks), by mode",
            ["mode"],
            buckets=KEYS_BUCKETS,
            registry=r,
        )
        self.precise_fallbacks = Counter(
            "continuum_kv_precise_fallbacks",
            "Requests of a precise group matched approximately instead (tokenizer or /tokenize failed)",
            ["group", "reason"],
            registry=r,
        )
        self.tokenizer_audits = Counter(
            "continuum_kv_tokenizer_audits",
            "Background checks of a precise group's local tokenizer against an engine's /tokenize",
            ["group", "result"],
            registry=r,
        )
        self.remote_tokenize = Counter(
            "continuum_kv_remote_tokenize",
            "Precise requests without a local tokenizer, by how their tokens were found (request: a"
            " /tokenize call on the request's path; known, known_prefix: remembered by conversation"
            " prefix, no call; new: too little remembered, routed with approximate keys and"
            " tokenized afterwards, tokenize_new_prompts off_path; late: the call on the path outlasted"
            " tokenize_wait_ms, routed with approximate keys, the call finishing off the path as"
            " late_answered or late_failed, or cancelled as late_dropped when too many are left), and off-path /tokenize calls"
            " (background, background_skipped,"
            " background_failed), what was learnt from the token ids a vLLM engine returned with its"
            " answer instead (answer_ids) and answers that came without them (answer_ids_missing),"
            " and tokenizations another ingress replica shared (shared)",
            ["group", "how"],
            registry=r,
        )
        self.local_encoding = Counter(
            "continuum_kv_local_encoding",
            "Precise requests with a local tokenizer, by how far their prompt was encoded before routing"
            " (whole; held: only as far as some backend holds it, tokenize_unheld_text off_path) and what"
            " became of the rest of a held one after its request was forwarded (rest_encoded, rest_failed,"
            " rest_skipped when too many waited)",
            ["group", "how"],
            registry=r,
        )
        self.block_read_errors = Counter(
            "continuum_kv_block_index_read_errors",
            "Block index reads that failed or were skipped after a recent failure",
            registry=r,
        )
        self.block_read_seconds = Histogram(
            "continuum_kv_block_index_read_seconds",
            "One block index read (all requests of one event-loop turn)",
            buckets=QUERY_BUCKETS,
            registry=r,
        )
        self.affinity_moves = Counter(
            "continuum_kv_affinity_moves",
            "Requests sent to a backend holding less of the prompt than the deepest holder, by why "
            "(bound: every deepest holder at the load bound; cost: a queue outweighed the prefix; "
            "placed: new work spread for balance)",
            ["reason"],
            registry=r,
        )
        decisions = Counter(
            "continuum_kv_decisions_shared",
            "Routing decisions shared with other ingress replicas over NATS",
            ["direction"],
            registry=r,
        )
        self.decisions_sent = decisions.labels("sent")
        self.decisions_received = decisions.labels("received")
        self.decisions_dropped = Counter(
            "continuum_kv_decisions_dropped",
            "Routing decisions not shared (queue full, NATS down, undecodable)",
            ["reason"],
            registry=r,
        )
        self.history_restored = Counter(
            "continuum_kv_route_history_restored",
            "Messages of the route history (stream CONTINUUM_KV_ROUTES) applied when this process "
            "started, by kind (decision, tokenization)",
            ["kind"],
            registry=r,
        )
        self.history_duplicates = Counter(
            "continuum_kv_route_history_duplicates",
            "Messages other replicas published while this process started its route history "
            "replay, delivered both live and by the replay: the second copy, not applied",
            registry=r,
        )
        self.history_replays = Counter(
            "continuum_kv_route_history_replays",
            "Replays of the route history when this process started, by result (done, timeout, "
            "failed: the stream could not be created or read)",
            ["result"],
            registry=r,
        )
        self.approximate_answers = Counter(
            "continuum_kv_approximate_answers",
            "Answered chat requests routed in approximate mode, by whether their answer could be "
            "read and recorded for the next turn (learnt) or not (unreadable)",
            ["group", "outcome"],
            registry=r,
        )
        recorded = Gauge(
            "continuum_kv_route_memory_entries",
            "Chain entries this router remembers sending (approximate records, speculative blocks)",
            registry=r,
        )
        recorded.set_function(recorded_entries)

    def _prefix_scorer_metrics(self, r: CollectorRegistry, speculative_entries: Callable[[], float]) -> None:
        self.query_seconds = Histogram(
            "continuum_kv_index_query_duration_seconds",
            "One pipelined index read (query_many) by the scorer, per batch of prefixes",
            buckets=QUERY_BUCKETS,
            registry=r,
        )
        lookups = Counter(
            "continuum_kv_index_lookups",
            "Prefixes looked up in the index by the scorer (hit: at least one holder)",
            ["result"],
            registry=r,
        )
        self.hits = lookups.labels("hit")
        self.misses = lookups.labels("miss")
        self.query_errors = Counter(
            "continuum_kv_index_query_errors", "Scorer index reads that failed or timed out", registry=r
        )
        self.speculative_routes = Counter(
            "continuum_kv_index_speculative_routes",
            "kv_aware decisions whose winner held the prefix only provisionally (speculative entry)",
            registry=r,
        )
        gauge = Gauge(
            "continuum_kv_index_speculative_entries", "Live provisional (prefix, backend) entries", registry=r
        )
        gauge.set_function(speculative_entries)
