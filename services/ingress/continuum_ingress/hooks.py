"""Extension points other issues plug into (see docs/ingress.md, "Seams").

* `ResponseCacheHook` (Tier 2/3): consulted before selection; records responses. It speaks the
  response cache's own types (`cache.CacheLookup`, `cache.CachedResponse`).
* `Component`: start / reload / aclose with the app's lifespan and configuration.
* `BodyRewriter`: per-attempt body rewrites that depend on the chosen backend (salt echo and
  Anthropic cache_control are built in; the Gemini context cache adds its own).
* `RejectionHandler`: a body rewriter that may resend once to the same backend after a 4xx
  caused by its own rewrite (a Gemini cache reference that expired: resend without it).
* `RequestScorer`: the Tier 4 scorer (kv/selector.py); a `policy.scorer.BackendScorer` (the
  seed's prepare/score contract over a prefix key) is accepted too.
* `ANSWER_RECORDER`: a component that wants the answer the client receives (the KV scorer
  learns a conversation's next prefix from it) puts a `ResponseRecorder` in
  `state.extras[ANSWER_RECORDER]` before the request is forwarded; the forwarder feeds it as it
  feeds the response cache's recorder.
* `ANSWER_FILTER`: a body rewriter that asks the backend for more than the client asked for
  (the KV scorer asks vLLM for the answer's token ids) puts a `ResponseTranslator` in
  `state.extras[ANSWER_FILTER]` for the attempt; the forwarder passes a successful answer
  through it, before the client and the recorders, when the backend's dialect has no
  translator of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from continuum_ingress.cache.facade import CACHE_OFF, CacheLookup

if TYPE_CHECKING:
    from continuum_common.config import Backend, RouterConfig
    from continuum_ingress.policy.kv_cost import KvChoice
    from continuum_ingress.pool import BackendState
    from continuum_ingress.snapshot import RouterSnapshot
    from continuum_ingress.state import RequestState


ANSWER_RECORDER = "answer_recorder"
ANSWER_FILTER = "answer_filter"


class ResponseRecorder(Protocol):
    """Receives the bytes sent to the client for one upstream answer."""

    def feed(self, chunk: bytes) -> None:
        """Called with each body chunk as it is sent (once for a non-streamed body)."""

    async def commit(self, status: int, headers: Sequence[tuple[str, str]]) -> object:
        """The whole response reached the client successfully: store it (bounded time). The
        return value (the cache's "stored or not") is not used by the ingress."""

    def abort(self) -> None:
        """The response failed or was cut short: forget what was fed."""

    def abandon(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        """The request ended before the upstream's end reached the ingress (the client closed
        the connection, or the request was cancelled), after everything fed had been sent:
        keep the answer if it is already whole (a stream whose terminal event went out, which
        clients often close on), else forget it as `abort` does. Never waits: anything to
        store is stored in the background."""


class RecorderPair:
    """Two recorders fed the same answer (the response cache's and `ANSWER_RECORDER`'s)."""

    __slots__ = ("first", "second")

    def __init__(self, first: ResponseRecorder, second: ResponseRecorder) -> None:
        self.first = first
        self.second = second

    def feed(self, chunk: bytes) -> None:
        self.first.feed(chunk)
        self.second.feed(chunk)

    async def commit(self, status: int, headers: Sequence[tuple[str, str]]) -> object:
        try:
            return await self.first.commit(status, headers)
        finally:
            await self.second.commit(status, headers)

    def abort(self) -> None:
        try:
            self.first.abort()
        finally:
            self.second.abort()

    def abandon(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        try:
            self.first.abandon(status, headers)
        finally:
            self.second.abandon(status, headers)


def answer_recorders(state: RequestState, cache: ResponseRecorder | None) -> ResponseRecorder | None:
    """The recorders of one answer: the response cache's (`cache`) and `ANSWER_RECORDER`'s."""
    answer = state.extras.get(ANSWER_RECORDER)
    if answer is None:
        return cache
    return answer if cache is None else RecorderPair(cache, answer)


class ResponseCacheHook(Protocol):
    @property
    def enabled(self) -> bool: ...

    async def lookup(self, state: RequestState) -> CacheLookup:
        """HIT (with `response`), MISS, BYPASS or OFF (not cached, no X-Cache header); must
        bound its own I/O time and never raise for a store outage (fall back to MISS/BYPASS)."""
        ...

    def recorder(self, state: RequestState, lookup: CacheLookup) -> ResponseRecorder | None:
        """A recorder for a MISS worth storing, else None."""
        ...


class NoResponseCache:
    """The default hook: no cache, no X-Cache header, no cost on the request path."""

    enabled = False

    async def lookup(self, state: RequestState) -> CacheLookup:
        return CACHE_OFF

    def recorder(self, state: RequestState, lookup: CacheLookup) -> ResponseRecorder | None:
        return None


class Component(Protocol):
    """Something the ingress runs for its lifetime (response cache, KV scorer, Gemini cache
    client): started in the lifespan before traffic, told about every accepted configuration
    reload, closed after the last request."""

    async def start(self) -> None: ...

    def reload(self, config: RouterConfig) -> None: ...

    async def aclose(self) -> None: ...


class BodyRewriter(Protocol):
    async def rewrite(
        self, state: RequestState, snapshot: RouterSnapshot, backend: Backend, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Return a new body for this attempt, or None to leave it as is. Must not mutate
        `body` (a retry on another backend starts again from the client's body)."""
        ...


@runtime_checkable
class RejectionHandler(Protocol):
    """Implemented by body rewriters whose rewrite a backend can reject (Gemini: a cachedContents
    reference that expired or was deleted). On a 4xx answer the forwarder asks `wants_body`; when
    one handler wants it, the (small, bounded) error body is read and `retry_body` may return a
    body to send once more to the same backend, in the same attempt. Otherwise the 4xx goes to
    the client unchanged."""

    def wants_body(self, state: RequestState, backend: Backend, status: int) -> bool: ...

    def retry_body(self, state: RequestState, backend: Backend, status: int, body: bytes) -> dict[str, Any] | None: ...


@runtime_checkable
class RequestScorer(Protocol):
    """Tier 4: decides (or declines to decide) the backend of one attempt from what the
    candidates already hold of the request's prompt, then hears where the attempt went."""

    timeout_s: float  # the pipeline bounds decide() by this

    async def decide(
        self, state: RequestState, snapshot: RouterSnapshot, candidates: Sequence[BackendState]
    ) -> KvChoice | None: ...

    def note(self, state: RequestState, backend: BackendState, kv_aware: bool) -> None: ...
