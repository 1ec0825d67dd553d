"""Responses conversations that continue a stored response stay with the backend that stored it
(docs/ingress.md, "Stored Responses conversations").

Engines that store Responses (vLLM with its response store, SGLang) keep them in their own
process: a request whose `previous_response_id` reaches another engine is answered 404, and
that engine holds none of the conversation's KV cache either. The router remembers which
backend produced each Responses answer it forwarded (the id of the response object, or of the
stream's `response.created` event) and sends the next turn there. An id this process never saw
(another replica or worker forwarded it, the process restarted, the id was forgotten) is
found by asking: each backend that answers 404 naming the id is passed over for the next
candidate, up to `max_probes` backends, and the answer that comes back teaches the id of the
next turn. With a shared load view (load_share.py) the ids learnt here also travel to the other
replicas and workers with the next load report (every `load_sharing.interval_ms`), so they
route those conversations without asking; a turn sent before that report arrived asks.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter

from continuum_common.config import ResponseAffinity as AffinityConfig
from continuum_common.config import RouterConfig
from continuum_ingress.policy.response_owners import ResponseOwners
from continuum_ingress.pool import BackendState
from continuum_ingress.protocol.response_ids import id_in_body, id_in_stream_head, previous_response_id
from continuum_ingress.state import RequestState

OUTCOMES = ("owner", "owner_unavailable", "unknown", "probed", "learned", "no_id", "adopted", "share_dropped")
# Ids waiting for the next load report; past this (a burst beyond what reports carry) the
# oldest are not shared (counted), and the other processes ask for them instead.
SHARE_QUEUE = 8192


class ResponseAffinity:
    def __init__(
        self, config: AffinityConfig, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.owners = ResponseOwners(config.max_entries, config.ttl)
        self.clock = clock
        counter = Counter(
            "continuum_response_affinity",
            "Responses requests routed by previous_response_id, and response ids learnt, by outcome "
            "(owner: sent to the backend that stored it; owner_unavailable: that backend is not a "
            "candidate now; unknown: never seen here; probed: a backend answered 404 for it and the "
            "next was asked; learned / no_id: an answer's id remembered / absent; adopted: an id "
            "another process learnt; share_dropped: an id not shared, the queue being full)",
            ["outcome"],
            registry=registry,
        )
        self._counts = {outcome: counter.labels(outcome) for outcome in OUTCOMES}
        self._outbox: collections.deque[tuple[str, str]] | None = None  # None: no load view

    def share(self) -> None:
        """From now on, ids learnt here are handed to the load view (`take_shared`)."""
        if self._outbox is None:
            self._outbox = collections.deque()

    def take_shared(self, limit: int) -> list[tuple[str, str]]:
        outbox = self._outbox
        if not outbox:
            return []
        return [outbox.popleft() for _ in range(min(limit, len(outbox)))]

    def adopt(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Ids another process learnt (its load report)."""
        now = self.clock()
        for response_id, backend in pairs:
            self.owners.remember(response_id, backend, now)
        self._counts["adopted"].inc(len(pairs))

    def count(self, outcome: str) -> None:
        self._counts[outcome].inc()

    def owner(self, response_id: str) -> str | None:
        """The backend that produced `response_id`, when it is remembered here."""
        return self.owners.owner(response_id, self.clock())

    def remember(self, response_id: str, backend: str) -> None:
        """`backend` holds `response_id` (it answered a request about it)."""
        self.owners.remember(response_id, backend, self.clock())

    def reload(self, config: RouterConfig) -> None:
        section = config.response_affinity
        self.owners.resize(section.max_entries, section.ttl)

    def route(
        self, state: RequestState, config: AffinityConfig, candidates: Sequence[BackendState]
    ) -> BackendState | None:
        """The candidate that stored the response this request continues, if it is one. An
        unknown id marks the request for probing (`state.probe_response`)."""
        previous = previous_response_id(state.request)
        if previous is None or not config.enabled:
            return None
        owner = self.owner(previous)
        if owner is None:
            if not state.attempts:  # counted once per request, not per retry
                self.count("unknown")
            state.probe_response = previous if config.probe else None
            return None
        for backend in candidates:
            if backend.name == owner:
                self.count("owner")
                return backend
        self.count("owner_unavailable")
        return None

    def learn_body(self, backend: str, data: bytes) -> None:
        """A whole Responses answer (2xx) came from `backend`."""
        self._learn(backend, id_in_body(data))

    def learn_stream(self, backend: str, first_chunk: bytes | None) -> None:
        """A Responses stream (2xx) from `backend` began with `first_chunk`."""
        self._learn(backend, id_in_stream_head(first_chunk) if first_chunk else None)

    def _learn(self, backend: str, response_id: str | None) -> None:
        if response_id is None:
            self.count("no_id")
            return
        self.owners.remember(response_id, backend, self.clock())
        self.count("learned")
        outbox = self._outbox
        if outbox is not None:
            if len(outbox) >= SHARE_QUEUE:
                outbox.popleft()
                self.count("share_dropped")
            outbox.append((response_id, backend))
