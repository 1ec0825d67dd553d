"""The per-request state every stage reads and records into."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from continuum_common.ring import RouteLabel
from continuum_ingress.policy.scorer import HoldingTier
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.client_headers import ClientHeaders
from continuum_ingress.protocol.requests import ParsedRequest
from continuum_ingress.request_trace import RequestTrace


@dataclass(slots=True)
class RequestState:
    request_id: str
    request: ParsedRequest
    raw: bytes
    client: ClientHeaders
    # The request's raw ASGI headers (lower-case names), for hooks that need more than `client`.
    raw_headers: Sequence[tuple[bytes, bytes]]
    # X-Session-ID header, else the body's `user` (OpenAI) / `metadata.user_id` (Anthropic).
    session_key: str | None
    started: float
    # Tier 1: computed once per request (None when prefix routing is off or nothing anchors it).
    prefix_key: bytes | None = None
    # Routing record, updated on every selection (a retry overwrites it with the final pick).
    backend: str | None = None
    route_label: RouteLabel | None = None
    scorer_tier: HoldingTier | None = None
    scorer_score: float | None = None
    # Uncached prompt tokens the chosen backend has to prefill (set by the KV scorer; counted in
    # the backend's queue from the attempt's start until its first byte).
    prefill_tokens: int = 0
    attempts: list[str] = field(default_factory=list)
    # When the body was read and parsed, the last attempt sent to its backend, and that
    # backend's first chunk read (the clock of `started`; 0: not yet), for the stream stages.
    read_at: float = 0.0
    sent_at: float = 0.0
    first_chunk_at: float = 0.0
    # The stored response (`previous_response_id`) this request continues, when no backend is
    # known to hold it: a backend answering 404 for it is passed over (response_affinity.py).
    probe_response: str | None = None
    # Tier 2: the response cache's headers for the client (X-Cache: HIT | MISS | BYPASS and
    # the cache's own, e.g. X-Cache-Mode); empty when no cache ran.
    cache_headers: Sequence[tuple[str, str]] = ()
    # Per-request notes of components, by component name (the Gemini context cache keeps its
    # decision for the attempt here, for the dialect and the stale-reference resend).
    extras: dict[str, Any] = field(default_factory=dict)
    # The request's spans (request_trace.py); None when tracing is off.
    trace: RequestTrace | None = None
    # The task serving the request (set by the endpoint; deadlines on the request path use it
    # instead of looking it up, see deadline.py).
    task: asyncio.Task[Any] | None = None

    def headers(self) -> dict[str, str]:
        """The request headers as a lower-case-name mapping (built on demand; the last value of
        a repeated header wins)."""
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in self.raw_headers}

    @property
    def api(self) -> Api:
        return self.request.api

    @property
    def key_api(self) -> Api:
        """The API whose rules the routing keys follow (ParsedRequest.key_api)."""
        return self.request.key_api

    @property
    def key_body(self) -> dict[str, Any]:
        """The body the routing keys are computed from (ParsedRequest.key_body)."""
        return self.request.key_body

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def stream(self) -> bool:
        return self.request.stream
