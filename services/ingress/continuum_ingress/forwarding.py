"""Forwarding one client request to a backend.

* One attempt per selection; ONE retry on the next candidate (the failed backend excluded)
  when nothing of the answer reached the client yet: a connect failure or a network error
  before any response byte, a 5xx answer, a stream whose first token did not come within the
  backend's `first_byte_timeout_ms` (or broke off before it), or a backend the health checker
  took out of rotation while the request waited for its first byte. A non-streamed read
  timeout is not retried (the generation may simply be slow; repeating it doubles the load),
  and nothing is retried once the upstream answered with a status below 500 and the client
  had a byte of its body.
* A stream's head is sent to the client as soon as the backend's 2xx head came (engines send
  it at once, before the prefill), so the client has read it by the time the first token
  comes. No body byte has gone out yet, so the retries above still happen: the next backend's
  answer follows under the same head (its `x-continuum-backend` names the backend that sent
  the head). When no attempt brings a first chunk, the stream ends with an in-band error
  event (`ForwardEndpoint`). After the first chunk, a pause longer than
  `stream_idle_timeout_ms` ends the stream like any upstream failure.
* Non-streamed answers are read whole and sent with a Content-Length. Streams are passed
  through chunk by chunk as they come off the socket (de-chunked by the parser, re-chunked by
  the server; nothing decoded or re-encoded, no added buffer), each written to the client
  during its send rather than at the end of the loop's turn; an upstream failure mid-stream ends
  the stream with an in-band provider-shaped error event, since the status line is long gone.
* The pool's live state (in-flight, EWMA latency, success window, circuit breaker) is updated
  for every attempt; a cancelled request (client gone) closes the upstream response, which
  closes the upstream connection and makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.trace import Span

from continuum_common.config import Backend
from continuum_ingress.asgi import Channel
from continuum_ingress.cache.facade import CacheLookup, CacheStatus
from continuum_ingress.deadline import Deadline
from continuum_ingress.errors import NoBackend, RequestError
from continuum_ingress.hooks import ANSWER_FILTER, BodyRewriter, RejectionHandler, ResponseRecorder, answer_recorders
from continuum_ingress.metrics import IngressMetrics
from continuum_ingress.pipeline import SelectionPipeline
from continuum_ingress.pool import BackendState
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.dialects import (
    AttemptDialect,
    DialectAttempt,
    ResponseTranslator,
    UpstreamDialect,
)
from continuum_ingress.protocol.errors import stream_error_event
from continuum_ingress.protocol.response_ids import not_found_here
from continuum_ingress.relay import (
    ChunkSink,
    FirstChunk,
    pump_of,
    read_first_chunk,
    response_headers,
    stream_headers,
    text_headers,
)
from continuum_ingress.request_trace import end_upstream
from continuum_ingress.response_affinity import ResponseAffinity
from continuum_ingress.snapshot import RouterSnapshot
from continuum_ingress.state import RequestState
from continuum_ingress.transport import (
    ReadTimeout,
    Upstream,
    UpstreamError,
    UpstreamResponse,
)

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # the first try and one retry
MAX_ERROR_BODY = 64 * 1024  # how much of an upstream 5xx body is read before it is dropped


class _Retryable(Exception):
    def __init__(self, error: RequestError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


class Forwarder:
    def __init__(
        self,
        pipeline: SelectionPipeline,
        metrics: IngressMetrics,
        dialects: Mapping[str, UpstreamDialect],
        rewriters: Sequence[BodyRewriter] = (),
        clock: Callable[[], float] = time.monotonic,
        *,
        affinity: ResponseAffinity | None = None,
        stage_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.pipeline = pipeline
        self.affinity = affinity
        self.metrics = metrics
        self.dialects = dialects
        self.rewriters = tuple(rewriters)
        self.rejection_handlers = tuple(r for r in self.rewriters if isinstance(r, RejectionHandler))
        # Dialects that prepare each attempt themselves (checked once here, not per request).
        self.binders = {t: d for t, d in dialects.items() if isinstance(d, AttemptDialect)}
        self.clock = clock
        # the endpoint's clock (RequestState.started), for the stream stages
        self.stage_clock = stage_clock

    async def forward(
        self, state: RequestState, snapshot: RouterSnapshot, channel: Channel, lookup: CacheLookup
    ) -> None:
        """Serve the request from a backend; raises RequestError only before the response began."""
        last: RequestError | None = None
        allowed = MAX_ATTEMPTS
        while len(state.attempts) < allowed:
            try:
                backend = await self._choose(state, snapshot)
            except NoBackend:
                if last is not None:
                    raise last from None
                raise
            state.attempts.append(backend.name)
            if state.probe_response is not None:  # set by the first choice: ask more backends
                allowed = max(MAX_ATTEMPTS, snapshot.config.response_affinity.max_probes)
            try:
                await self._attempt(state, snapshot, backend, channel, lookup)
                return
            except _Retryable as exc:
                last = exc.error
                if len(state.attempts) < allowed:
                    self.metrics.retry(exc.reason)
                    log.info("retrying on another backend: %s (request %s)", exc.error.message, state.request_id)
        assert last is not None
        raise last

    async def _choose(self, state: RequestState, snapshot: RouterSnapshot) -> BackendState:
        if state.trace is None:
            return await self.pipeline.choose(state, snapshot, state.attempts)
        with state.trace.span("route.select") as span:
            backend = await self.pipeline.choose(state, snapshot, state.attempts)
            span.set_attribute("continuum.backend", backend.name)
            if state.route_label is not None:
                span.set_attribute("continuum.route", state.route_label.value)
            if state.scorer_tier is not None:
                span.set_attribute("continuum.kv_tier", state.scorer_tier.value)
            return backend

    async def _body(self, state: RequestState, snapshot: RouterSnapshot, spec: Backend) -> dict[str, Any] | None:
        body = state.request.body
        changed = False
        for rewriter in self.rewriters:
            new = await rewriter.rewrite(state, snapshot, spec, body)
            if new is not None:
                body, changed = new, True
        return body if changed else None

    async def _attempt(
        self,
        state: RequestState,
        snapshot: RouterSnapshot,
        backend: BackendState,
        channel: Channel,
        lookup: CacheLookup,
    ) -> None:
        spec = snapshot.backends[backend.name]
        client = snapshot.clients[spec.name]
        body = await self._body(state, snapshot, spec)
        dialect, target = self._prepare(state, spec, client)
        content = dialect.encode(state.api, body, state.raw)
        headers = dialect.headers(state.api, snapshot.api_keys.get(spec.name), state.client)
        span: Span | None = None
        if state.trace is not None:
            span, headers = state.trace.upstream(backend.name, len(state.attempts), headers)
        outcome, status = "success", None
        start = self.clock()
        backend.begin(start)
        backend.queue_prefill(state.prefill_tokens)  # released at the first byte (_stream) or the end
        state.sent_at, state.first_chunk_at = self.stage_clock(), 0.0
        try:
            response, first = await self._first_byte(
                state, spec, backend, client=client, target=target, headers=headers, content=content,
                channel=channel, dialect=dialect,
            )  # fmt: skip
            if first is not None:
                state.first_chunk_at = first.arrived_at or self.stage_clock()
            status = response.status
            try:
                preread: bytes | None = None
                if state.probe_response is not None and status == 404:
                    preread = await self._probe(state, backend, response)
                if self.rejection_handlers and preread is None and 400 <= response.status < 500:
                    # may resend: the response to serve (and close) is then the new one
                    response, preread = await self._reconsider(
                        state, spec, backend, response, dialect=dialect, client=client, target=target, headers=headers
                    )
                    status = response.status
                await self._deliver(
                    state, spec, backend, response, first=first, preread=preread,
                    dialect=dialect, channel=channel, lookup=lookup, start=start,
                )  # fmt: skip
            finally:
                await response.aclose()
        except asyncio.CancelledError:
            # Client gone (or shutdown): no verdict on the backend, and free a half-open trial.
            backend.record_abandon(self.clock())
            self.metrics.backend(backend.name, "cancelled")
            outcome = "cancelled"
            raise
        except _Retryable as exc:
            outcome = exc.reason
            raise
        except RequestError as exc:
            outcome = exc.code or "error"
            raise
        finally:
            backend.finish()
            backend.prefill_done(state.prefill_tokens)
            state.prefill_tokens = 0
            if span is not None:
                end_upstream(span, status, "client_error" if outcome == "success" and (status or 0) >= 400 else outcome)

    async def _deliver(
        self,
        state: RequestState,
        spec: Backend,
        backend: BackendState,
        response: UpstreamResponse,
        *,
        first: FirstChunk | None,
        preread: bytes | None,
        dialect: UpstreamDialect | DialectAttempt,
        channel: Channel,
        lookup: CacheLookup,
        start: float,
    ) -> None:
        """The answer to the client: a 5xx retried, else streamed or whole."""
        if response.status >= 500:
            await self._server_error(response, backend)
        if first is None and channel.started:  # an earlier attempt's stream head went out
            self.metrics.backend(backend.name, "client_error")
            raise RequestError(
                502,
                f"Backend '{backend.name}' answered HTTP {response.status} to a retried stream.",
                kind="bad_gateway",
                code="backend_error",
            )
        backend.record_success(self.clock() - start)
        # a stream's translator was made for its first chunk (which may already have gone out)
        translator = dialect.translator(state.api, state.stream) if first is None else first.translator
        if first is not None and self.affinity is not None and _makes_response_ids(state, response, translator):
            self.affinity.learn_stream(backend.name, first.first)
        if translator is None and response.status < 300:
            translator = state.extras.get(ANSWER_FILTER)
        cached = self.pipeline.response_cache.recorder(state, lookup) if lookup.status is CacheStatus.MISS else None
        recorder = answer_recorders(state, cached)
        if first is not None:
            response.read_timeout = min(response.read_timeout, spec.stream_idle_timeout_ms / 1000)
            await self._stream(
                state, backend=backend, response=response, first=first, channel=channel, translator=translator,
                recorder=recorder,
            )  # fmt: skip
        else:
            await self._whole(
                state, backend=backend, response=response, channel=channel, translator=translator,
                recorder=recorder, data=preread,
            )  # fmt: skip

    async def _first_byte(
        self,
        state: RequestState,
        spec: Backend,
        backend: BackendState,
        *,
        client: Upstream,
        target: str,
        headers: list[tuple[str, str]],
        content: bytes,
        channel: Channel,
        dialect: UpstreamDialect | DialectAttempt,
    ) -> tuple[UpstreamResponse, FirstChunk | None]:
        """Send the attempt and wait for its first byte: the response head, and for a successful
        stream its first body chunk (engines send a stream's head at once and its first token
        after the prefill). Nothing has reached the client yet, so a stream whose first chunk
        does not come within `first_byte_timeout_ms`, and any request still waiting when the
        health checker takes the backend out, is retried on another backend."""
        task = state.task or asyncio.current_task()
        assert task is not None
        when = task.get_loop().time() + spec.first_byte_timeout_ms / 1000 if state.stream else None
        try:
            with Deadline(task, when) as deadline:
                backend.first_byte_waits.add(deadline)
                try:
                    try:  # not through _send(): one coroutine less on every request
                        response = await client.transport.request("POST", target, headers, content)
                    except UpstreamError as exc:
                        raise self._send_failed(exc, backend) from None
                    if not state.stream or response.status >= 300:
                        return response, None
                    if not channel.started:
                        # The head at once, as the engine sent it: the client has read it by
                        # the time the first token comes, which then is all it waits for.
                        await channel.start(response.status, stream_headers(response, state, backend.name))
                    own = dialect.translator(state.api, state.stream)
                    filtered = own or state.extras.get(ANSWER_FILTER)
                    try:
                        first = await read_first_chunk(
                            response, channel, own=own, translator=filtered, deadline=deadline, clock=self.stage_clock
                        )
                        return response, first
                    except BaseException:
                        await response.aclose()
                        raise
                finally:
                    backend.first_byte_waits.discard(deadline)
        except TimeoutError:
            if not backend.healthy:
                self.metrics.backend(backend.name, "backend_down")
                error = RequestError(
                    503,
                    f"Backend '{backend.name}' was taken out of rotation while the request waited for it.",
                    kind="unavailable",
                    code="backend_down",
                )
                raise _Retryable(error, "backend_down") from None
            backend.record_failure(self.clock())
            self.metrics.backend(backend.name, "timeout")
            error = RequestError(
                504,
                f"Backend '{backend.name}' sent no first token within {spec.first_byte_timeout_ms / 1000:g}s.",
                kind="timeout",
                code="first_byte_timeout",
            )
            raise _Retryable(error, "first_byte_timeout") from None
        except UpstreamError as exc:  # the stream broke before its first chunk: nothing sent yet
            backend.record_failure(self.clock())
            self.metrics.backend(backend.name, "stream_error")
            error = RequestError(
                502, f"Backend '{backend.name}' broke off its answer ({exc}).", kind="bad_gateway", code="backend_error"
            )
            raise _Retryable(error, "stream_error") from None

    def _prepare(
        self, state: RequestState, spec: Backend, client: Upstream
    ) -> tuple[UpstreamDialect | DialectAttempt, str]:
        """The dialect object for this attempt and the request target."""
        binder = self.binders.get(spec.type)
        if binder is not None:
            attempt = binder.bind(state, spec, client)
            return attempt, attempt.target
        dialect = self.dialects[spec.type]
        return dialect, client.target(dialect.path(state.api))

    async def _reconsider(
        self,
        state: RequestState,
        spec: Backend,
        backend: BackendState,
        response: UpstreamResponse,
        *,
        dialect: UpstreamDialect | DialectAttempt,
        client: Upstream,
        target: str,
        headers: list[tuple[str, str]],
    ) -> tuple[UpstreamResponse, bytes | None]:
        """A 4xx: let a rejection handler (the rewriter that caused it) resend once to the same
        backend. Returns the response to serve and, when its body was already read, the body."""
        handlers = [h for h in self.rejection_handlers if h.wants_body(state, spec, response.status)]
        if not handlers:
            return response, None
        data = await self._read(response, backend)
        for handler in handlers:
            body = handler.retry_body(state, spec, response.status, data[:MAX_ERROR_BODY])
            if body is not None:
                await response.aclose()
                content = dialect.encode(state.api, body, state.raw)
                return await self._send(client, target, headers, content, backend), None
        return response, data

    async def _send(
        self, client: Upstream, target: str, headers: list[tuple[str, str]], content: bytes, backend: BackendState
    ) -> UpstreamResponse:
        try:
            return await client.transport.request("POST", target, headers, content)
        except UpstreamError as exc:
            raise self._send_failed(exc, backend) from None

    def _send_failed(self, exc: UpstreamError, backend: BackendState) -> Exception:
        """What a failed send becomes: a read timeout is not retried (the generation may simply
        be slow), a request that got no answer at all is (safe on the next backend)."""
        backend.record_failure(self.clock())
        if isinstance(exc, ReadTimeout):
            self.metrics.backend(backend.name, "timeout")
            return RequestError(
                504, f"Backend '{backend.name}' did not answer in time.", kind="timeout", code="backend_timeout"
            )
        self.metrics.backend(backend.name, "connect_error")
        return _Retryable(
            RequestError(
                502,
                f"Could not reach backend '{backend.name}' ({exc}).",
                kind="bad_gateway",
                code="backend_unreachable",
            ),
            "connect_error",
        )

    async def _probe(self, state: RequestState, backend: BackendState, response: UpstreamResponse) -> bytes:
        """A 404 to a request continuing a response no backend is known to hold: when it names
        that response, this backend does not have it, and the next candidate is asked (the
        client gets a 404 only when none has it). Any other 404 is the answer: its body, read."""
        data = await self._read(response, backend)
        previous = state.probe_response
        assert previous is not None and self.affinity is not None
        if not not_found_here(response.status, data, previous):
            return data
        self.affinity.count("probed")
        error = RequestError(
            404,
            f"Response with id '{previous}' was not found on any backend asked.",
            kind="not_found",
            param="previous_response_id",
            code="response_not_found",
        )
        raise _Retryable(error, "response_not_found")

    async def _server_error(self, response: UpstreamResponse, backend: BackendState) -> None:
        """A 5xx before any byte reached the client: drop its body, count it, retry."""
        await self._drop(response)
        backend.record_failure(self.clock())
        self.metrics.backend(backend.name, "server_error")
        raise _Retryable(
            RequestError(
                502,
                f"Backend '{backend.name}' answered HTTP {response.status}.",
                kind="bad_gateway",
                code="backend_error",
            ),
            "server_error",
        )

    @staticmethod
    async def _drop(response: UpstreamResponse) -> None:
        seen = 0
        try:
            async for chunk in response.stream():
                seen += len(chunk)
                if seen > MAX_ERROR_BODY:
                    break
        except UpstreamError:
            pass

    async def _read(self, response: UpstreamResponse, backend: BackendState) -> bytes:
        try:
            return await response.read()
        except ReadTimeout:
            backend.record_failure(self.clock())
            self.metrics.backend(backend.name, "timeout")
            raise RequestError(
                504, f"Backend '{backend.name}' stopped answering.", kind="timeout", code="backend_timeout"
            ) from None
        except UpstreamError as exc:
            backend.record_failure(self.clock())
            self.metrics.backend(backend.name, "stream_error")
            raise RequestError(
                502, f"Backend '{backend.name}' broke off its answer ({exc}).", kind="bad_gateway", code="backend_error"
            ) from None

    async def _whole(
        self,
        state: RequestState,
        *,
        backend: BackendState,
        response: UpstreamResponse,
        channel: Channel,
        translator: ResponseTranslator | None,
        recorder: ResponseRecorder | None,
        data: bytes | None = None,
    ) -> None:
        if data is None:
            data = await self._read(response, backend)
        if self.affinity is not None and _makes_response_ids(state, response, translator):
            self.affinity.learn_body(backend.name, data)
        if translator is not None:
            data = translator.body(data)
        status = response.status
        self.metrics.backend(backend.name, "success" if status < 400 else "client_error")
        await channel.whole(status, response_headers(response.headers, state, backend.name), data)
        if recorder is not None:
            if status < 300:
                recorder.feed(data)
                await recorder.commit(status, text_headers(response.headers))
            else:
                recorder.abort()

    async def _stream(
        self,
        state: RequestState,
        *,
        backend: BackendState,
        response: UpstreamResponse,
        first: FirstChunk,
        channel: Channel,
        translator: ResponseTranslator | None,
        recorder: ResponseRecorder | None,
    ) -> None:
        # The head went out in _first_byte, before this first chunk was read.
        if state.prefill_tokens:
            backend.prefill_done(state.prefill_tokens)
            state.prefill_tokens = 0
        timed = state.first_chunk_at > 0.0
        # After the first chunk the client has, the rest goes out from the upstream connection's
        # callbacks while the client keeps up; this loop takes over whenever it does not.
        pump = pump_of(response, channel)
        sent = first.sent
        try:
            async for raw in first.chunks():
                if sent is not None:  # the first chunk went out from the callback: the rest of its work
                    timed = self._first_sent(state, first, recorder, timed)
                    sent = None
                elif chunk := (raw if translator is None else translator.chunk(raw)):
                    # Written now: the upstream read took everything buffered, so nothing else
                    # this turn would join it, and the turn's other work would only delay it.
                    await channel.body(chunk, more=True, flush=True)
                    if timed:  # the first chunk the client has: the stream stages end here
                        timed = False
                        self._stages(state)
                    if recorder is not None:  # a copy, after the client has it: never a delay
                        recorder.feed(chunk)
                if pump is not None and not timed:
                    await pump.pump(ChunkSink(pump.relay, translator, recorder))
            if translator is not None and (tail := translator.end()):
                await channel.body(tail, more=True)
            await channel.body(b"")
        except UpstreamError as exc:
            if recorder is not None:
                recorder.abort()
            await self._broken(state, backend, response, channel, exc)
            return
        except asyncio.CancelledError:
            # The client left (or the router is stopping) before the upstream's end: a stream
            # it closed on its terminal event is still a whole answer.
            if recorder is not None:
                recorder.abandon(response.status, text_headers(response.headers))
            raise
        except BaseException:
            if recorder is not None:
                recorder.abort()
            raise
        self.metrics.backend(backend.name, "success")
        if recorder is not None:
            await recorder.commit(response.status, text_headers(response.headers))

    def _first_sent(
        self, state: RequestState, first: FirstChunk, recorder: ResponseRecorder | None, timed: bool
    ) -> bool:
        """The rest of the work on a first chunk the upstream callback wrote: its stages and
        the recorder's copy. Returns whether the stages are still to be timed (it was empty)."""
        if first.sent:
            if timed:
                timed = False
                self._stages(state, first.written_at)
            if recorder is not None:
                recorder.feed(first.sent)
        return timed

    async def _broken(
        self,
        state: RequestState,
        backend: BackendState,
        response: UpstreamResponse,
        channel: Channel,
        exc: UpstreamError,
    ) -> None:
        """A stream the backend broke off (or let go idle) after it started: counted, and
        ended with an in-band error event in the API's shape."""
        backend.record_failure(self.clock())
        idle = isinstance(exc, ReadTimeout)
        self.metrics.backend(backend.name, "timeout" if idle else "stream_error")
        log.warning("backend %s broke off a stream: %s (request %s)", backend.name, exc, state.request_id)
        message = (
            f"Backend '{backend.name}' sent nothing for {response.read_timeout:g}s mid-stream."
            if idle
            else f"Backend '{backend.name}' broke off the stream ({type(exc).__name__})."
        )
        await channel.body(stream_error_event(state.api.error_style, message), more=True)
        await channel.body(b"")

    def _stages(self, state: RequestState, written_at: float = 0.0) -> None:
        read = state.read_at or state.started  # a state built without the endpoint: no read stage
        sent, first = state.sent_at, state.first_chunk_at
        end = written_at or self.stage_clock()
        self.metrics.stream_stages(read - state.started, sent - read, first - sent, end - first)


def _makes_response_ids(state: RequestState, response: UpstreamResponse, translator: ResponseTranslator | None) -> bool:
    """A successful Responses answer from a backend that speaks the Responses API itself (no
    translator): it made the response id the client will continue from."""
    return state.api is Api.RESPONSES and response.status < 300 and translator is None
