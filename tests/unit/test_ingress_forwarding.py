"""The forwarder's decisions over an in-memory transport (no sockets): which failures are
retried on the next backend, the first-byte and idle timeouts of streams, stream passthrough,
what reaches the client when a backend fails, and the response-cache recorder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from continuum_ingress.adapters.upstream import ClientSet
from continuum_ingress.asgi import Channel, Message
from continuum_ingress.cache import CacheLookup, CacheStatus
from continuum_ingress.errors import NoBackend, RequestError
from continuum_ingress.forwarding import MAX_ERROR_BODY, Forwarder
from continuum_ingress.metrics import IngressMetrics
from continuum_ingress.pipeline import SelectionPipeline
from continuum_ingress.pool import BackendPool
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.client_headers import ClientHeaders
from continuum_ingress.protocol.dialects import default_dialects
from continuum_ingress.protocol.requests import parse_request
from continuum_ingress.snapshot import RouterSnapshot, SnapshotFactory
from continuum_ingress.state import RequestState
from continuum_ingress.transport import ConnectFailed, Disconnected, ReadTimeout, UpstreamResponse
from continuum_testing.ingress_harness import router_config

OK_BODY = b'{"id":"x","choices":[]}'
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream")]


@dataclass
class Reply:
    """One scripted upstream answer. `body` items: bytes (a chunk), a float (a pause in
    seconds before the next item) or an exception (raised by the body iterator)."""

    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(default_factory=lambda: list(JSON))
    body: list[bytes | float | Exception] = field(default_factory=lambda: [OK_BODY])
    fail: Exception | None = None  # raised by request() instead of answering
    head_delay: float = 0.0


class FakeResponse:
    def __init__(self, reply: Reply, read_timeout: float) -> None:
        self.status = reply.status
        self.headers = list(reply.headers)
        self.read_timeout = read_timeout
        self._body = reply.body
        self.closed = False

    async def stream(self) -> AsyncIterator[bytes]:
        for item in self._body:
            if isinstance(item, float):
                if item > self.read_timeout:  # the transport's wait for bytes runs out
                    await asyncio.sleep(self.read_timeout)
                    raise ReadTimeout("no answer from the server within the read timeout")
                await asyncio.sleep(item)
            elif isinstance(item, Exception):
                raise item
            else:
                yield item

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.stream()])

    async def aclose(self) -> None:
        self.closed = True


class FakeTransport:
    """A `Transport` that answers from a script and records what it was sent."""

    def __init__(self, replies: list[Reply], read_timeout: float) -> None:
        self.replies = replies
        self.read_timeout = read_timeout
        self.sent: list[tuple[str, str, dict[str, str], bytes]] = []
        self.responses: list[FakeResponse] = []

    async def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes = b"",
        *,
        read_timeout: float | None = None,
    ) -> UpstreamResponse:
        self.sent.append((method, path, dict(headers), body))
        reply = self.replies.pop(0)
        await asyncio.sleep(reply.head_delay)
        if reply.fail is not None:
            raise reply.fail
        response = FakeResponse(reply, self.read_timeout if read_timeout is None else read_timeout)
        self.responses.append(response)
        return response

    async def aclose(self) -> None:
        pass


class Client:
    """The ASGI send side: every message the forwarder sent to the client."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def chunks(self) -> list[bytes]:
        return [m["body"] for m in self.messages[1:]]


class Recorder:
    def __init__(self) -> None:
        self.fed: list[bytes] = []
        self.committed: tuple[int, Sequence[tuple[str, str]]] | None = None
        self.aborted = False
        self.abandoned: tuple[int, Sequence[tuple[str, str]]] | None = None

    def feed(self, chunk: bytes) -> None:
        self.fed.append(chunk)

    async def commit(self, status: int, headers: Sequence[tuple[str, str]]) -> object:
        self.committed = (status, headers)
        return True

    def abort(self) -> None:
        self.aborted = True

    def abandon(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        self.abandoned = (status, headers)


class RecordingCache:
    enabled = True

    def __init__(self) -> None:
        self.recorders: list[Recorder] = []

    async def lookup(self, state: RequestState) -> CacheLookup:
        return CacheLookup(CacheStatus.MISS, key="k")

    def recorder(self, state: RequestState, lookup: CacheLookup) -> Recorder:
        self.recorders.append(Recorder())
        return self.recorders[-1]


@dataclass
class Rig:
    forwarder: Forwarder
    snapshot: RouterSnapshot
    metrics: IngressMetrics
    pool: BackendPool
    transports: dict[str, FakeTransport]
    cache: RecordingCache

    def counter(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def forward(
        self, body: dict[str, Any], lookup: CacheLookup | None = None, *, started: float = 0.0
    ) -> tuple[RequestState, Client]:
        raw = orjson.dumps(body)
        state = RequestState("req-1", parse_request(Api.CHAT, raw), raw, ClientHeaders(), [], None, started)
        client = Client()
        await self.forwarder.forward(state, self.snapshot, Channel(client.send), lookup or CacheLookup(CacheStatus.OFF))
        return state, client


def rig(replies: dict[str, list[Reply]], **backend: Any) -> Rig:
    """Backends `replies` (in order: RoundRobin tries the first, a retry the next) on the
    in-memory transport."""
    config = router_config(
        {
            "selection_strategy": "RoundRobin",
            "backends": [
                {"name": name, "url": f"http://{name}.invalid:8000", "type": "vllm", "models": ["m"], **backend}
                for name in replies
            ],
        }
    )
    transports: dict[str, FakeTransport] = {}

    def transport(spec: Any, tls: Any) -> FakeTransport:
        transports[spec.name] = FakeTransport(replies[spec.name], spec.request_timeout_ms / 1000)
        return transports[spec.name]

    pool = BackendPool()
    metrics = IngressMetrics(pool)
    dialects = default_dialects()
    snapshot = SnapshotFactory(pool, ClientSet(transport), dialects).build(config, 1)
    cache = RecordingCache()
    pipeline = SelectionPipeline(pool, metrics, response_cache=cache)
    return Rig(Forwarder(pipeline, metrics, dialects), snapshot, metrics, pool, transports, cache)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**CHAT, "stream": True}


async def test_whole_answer_is_sent_with_routing_headers() -> None:
    r = rig({"a": [Reply(headers=[*JSON, (b"server", b"vllm"), (b"x-extra", b"1")])]})
    state, client = await r.forward(CHAT)
    assert client.status == 200 and client.chunks == [OK_BODY]
    headers = client.headers
    assert headers[b"x-continuum-backend"] == b"a" and headers[b"x-request-id"] == b"req-1"
    assert headers[b"content-length"] == str(len(OK_BODY)).encode()
    assert headers[b"x-extra"] == b"1" and b"server" not in headers  # hop/identity headers dropped
    method, path, sent_headers, sent_body = r.transports["a"].sent[0]
    assert (method, path) == ("POST", "/v1/chat/completions") and orjson.loads(sent_body) == CHAT
    assert sent_headers["accept-encoding"] == "identity"
    assert state.attempts == ["a"] and r.transports["a"].responses[0].closed
    assert r.counter("continuum_backend_requests_total", backend="a", outcome="success") == 1
    assert r.pool.get("a").local_in_flight == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (Reply(fail=ConnectFailed("refused")), "connect_error"),
        (Reply(fail=Disconnected("closed")), "connect_error"),
        (Reply(status=503, body=[b"overloaded"]), "server_error"),
    ],
)
async def test_a_failure_before_any_byte_is_retried_on_the_next_backend(failure: Reply, reason: str) -> None:
    r = rig({"a": [failure], "b": [Reply()]})
    state, client = await r.forward(CHAT)
    assert client.status == 200 and client.chunks == [OK_BODY]
    assert state.attempts == ["a", "b"] and client.headers[b"x-continuum-backend"] == b"b"
    assert r.counter("continuum_ingress_retries_total", reason=reason) == 1
    assert r.pool.get("a").success_rate < 1.0  # type: ignore[union-attr]


async def test_the_second_failure_is_the_answer_and_there_is_no_third_attempt() -> None:
    r = rig({"a": [Reply(status=500)], "b": [Reply(status=502)], "c": [Reply()]})
    with pytest.raises(RequestError) as caught:
        await r.forward(CHAT)
    assert caught.value.status == 502 and caught.value.code == "backend_error"
    assert r.transports["c"].sent == []


async def test_no_backend_left_for_the_retry_raises_the_first_error() -> None:
    r = rig({"a": [Reply(fail=ConnectFailed("refused"))]})
    with pytest.raises(RequestError) as caught:
        await r.forward(CHAT)
    assert caught.value.status == 502 and caught.value.code == "backend_unreachable"
    assert not isinstance(caught.value, NoBackend)


async def test_a_non_streamed_read_timeout_is_not_retried() -> None:
    r = rig({"a": [Reply(fail=ReadTimeout("slow"))], "b": [Reply()]})
    with pytest.raises(RequestError) as caught:
        await r.forward(CHAT)
    assert caught.value.status == 504 and caught.value.code == "backend_timeout"
    assert r.transports["b"].sent == []


async def test_a_client_error_is_passed_through_unretried() -> None:
    body = b'{"error":{"message":"bad"}}'
    r = rig({"a": [Reply(status=400, body=[body])], "b": [Reply()]})
    _, client = await r.forward(CHAT)
    assert client.status == 400 and client.chunks == [body]
    assert r.transports["b"].sent == []
    assert r.counter("continuum_backend_requests_total", backend="a", outcome="client_error") == 1


async def test_a_server_error_body_is_read_only_up_to_the_bound() -> None:
    huge = [b"x" * 4096] * (MAX_ERROR_BODY // 4096 + 50)
    r = rig({"a": [Reply(status=500, body=list(huge))], "b": [Reply()]})
    _, client = await r.forward(CHAT)
    assert client.status == 200
    assert r.transports["a"].responses[0].closed


async def test_stream_chunks_pass_through_as_they_come() -> None:
    events = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]
    r = rig({"a": [Reply(headers=list(SSE), body=list(events))]})
    _, client = await r.forward(STREAM)
    assert client.status == 200 and client.headers[b"x-accel-buffering"] == b"no"
    assert b"content-length" not in client.headers
    assert client.chunks == [*events, b""]  # one client message per upstream chunk, then the end
    assert all(m["more_body"] for m in client.messages[1:-1]) and not client.messages[-1]["more_body"]


def stage(r: Rig, name: str) -> tuple[float, float]:
    """(count, sum) of one stream stage."""
    labels = {"stage": name}
    count = r.metrics.registry.get_sample_value("continuum_ingress_stream_stage_seconds_count", labels)
    total = r.metrics.registry.get_sample_value("continuum_ingress_stream_stage_seconds_sum", labels)
    return count or 0.0, total or 0.0


async def test_a_stream_records_its_stages_up_to_the_first_chunk_once() -> None:
    events = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]
    r = rig({"a": [Reply(headers=list(SSE), body=list(events))]})
    # sent, first chunk read, first chunk handed to the client; the request was read at 0.0
    ticks = iter([0.002, 0.052, 0.0535])
    r.forwarder.stage_clock = lambda: next(ticks)
    state, client = await r.forward(STREAM)
    assert client.chunks == [*events, b""]
    assert stage(r, "read") == (1, 0.0)  # a state built without the endpoint's read time
    assert stage(r, "route") == (1, pytest.approx(0.002))
    assert stage(r, "backend") == (1, pytest.approx(0.05))
    assert stage(r, "to_client") == (1, pytest.approx(0.0015))
    assert (state.sent_at, state.first_chunk_at) == (0.002, 0.052)


async def test_only_streams_that_reach_the_client_record_stages() -> None:
    r = rig({"a": [Reply()], "b": [Reply(status=400, headers=list(SSE), body=[b"no"])]})
    await r.forward(CHAT)  # whole answer
    await r.forward(STREAM)  # an error answer to a stream: no first chunk timed
    assert stage(r, "route")[0] == stage(r, "backend")[0] == stage(r, "to_client")[0] == 0


async def test_a_retried_stream_times_its_last_attempt() -> None:
    slow = Reply(headers=list(SSE), body=[0.5, b"data: late\n\n"])
    r = rig({"a": [slow], "b": [Reply(headers=list(SSE), body=[b"data: x\n\n"])]}, first_byte_timeout_ms=50)
    await r.forward(STREAM, started=time.perf_counter())
    count, total = stage(r, "route")
    assert count == 1 and 0.04 <= total < 5  # the first attempt's wait counts before the one that served
    assert stage(r, "backend")[1] < 0.04


async def test_a_stream_without_a_first_token_in_time_is_retried() -> None:
    slow = Reply(headers=list(SSE), body=[0.5, b"data: late\n\n"])
    r = rig({"a": [slow], "b": [Reply(headers=list(SSE), body=[b"data: [DONE]\n\n"])]}, first_byte_timeout_ms=50)
    state, client = await r.forward(STREAM)
    assert state.attempts == ["a", "b"] and client.chunks == [b"data: [DONE]\n\n", b""]
    assert r.counter("continuum_ingress_retries_total", reason="first_byte_timeout") == 1
    assert r.counter("continuum_backend_requests_total", backend="a", outcome="timeout") == 1
    assert r.transports["a"].responses[0].closed  # the slow upstream answer is abandoned


async def test_the_first_byte_timeout_covers_the_response_head() -> None:
    r = rig(
        {"a": [Reply(head_delay=0.5)], "b": [Reply(headers=list(SSE), body=[b"data: ok\n\n"])]},
        first_byte_timeout_ms=50,
    )
    state, _ = await r.forward(STREAM)
    assert state.attempts == ["a", "b"]


async def test_a_stream_that_breaks_before_its_first_chunk_is_retried() -> None:
    r = rig(
        {
            "a": [Reply(headers=list(SSE), body=[Disconnected("reset")])],
            "b": [Reply(headers=list(SSE), body=[b"data: ok\n\n"])],
        }
    )
    state, _ = await r.forward(STREAM)
    assert state.attempts == ["a", "b"]
    assert r.counter("continuum_ingress_retries_total", reason="stream_error") == 1


async def test_a_stream_that_stalls_midway_ends_with_an_in_band_error() -> None:
    stalled = Reply(headers=list(SSE), body=[b'data: {"n":1}\n\n', 0.5, b"data: never\n\n"])
    r = rig({"a": [stalled], "b": [Reply()]}, stream_idle_timeout_ms=50)
    state, client = await r.forward(STREAM, CacheLookup(CacheStatus.MISS, key="k"))
    assert state.attempts == ["a"] and client.status == 200  # the head was sent: no retry
    first, error, end = client.chunks
    assert first == b'data: {"n":1}\n\n' and end == b""
    assert error.startswith(b"data: ") and b"sent nothing for 0.05s mid-stream" in error
    assert r.counter("continuum_backend_requests_total", backend="a", outcome="timeout") == 1
    assert r.cache.recorders[0].aborted and r.cache.recorders[0].committed is None


async def test_a_stream_broken_midway_ends_with_an_in_band_error() -> None:
    broken = Reply(headers=list(SSE), body=[b'data: {"n":1}\n\n', Disconnected("reset")])
    r = rig({"a": [broken]})
    _, client = await r.forward(STREAM)
    assert b"broke off the stream (Disconnected)" in client.chunks[1]
    assert r.counter("continuum_backend_requests_total", backend="a", outcome="stream_error") == 1


async def test_a_stream_cancelled_after_its_last_event_is_abandoned_not_aborted() -> None:
    # The client closed the connection on [DONE]; the upstream's end had not arrived yet.
    events = [b'data: {"n":1}\n\n', b"data: [DONE]\n\n"]
    r = rig({"a": [Reply(headers=list(SSE), body=[*events, 5.0])]})
    task = asyncio.create_task(r.forward(STREAM, CacheLookup(CacheStatus.MISS, key="k")))
    async with asyncio.timeout(5):
        while not r.cache.recorders or len(r.cache.recorders[0].fed) < 2:
            await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    recorder = r.cache.recorders[0]
    assert recorder.fed == events and recorder.committed is None and not recorder.aborted
    assert recorder.abandoned == (200, [("content-type", "text/event-stream")])


async def test_a_miss_is_recorded_after_the_client_has_it() -> None:
    events = [b'data: {"n":1}\n\n', b"data: [DONE]\n\n"]
    r = rig({"a": [Reply(headers=list(SSE), body=list(events))]})
    await r.forward(STREAM, CacheLookup(CacheStatus.MISS, key="k"))
    recorder = r.cache.recorders[0]
    assert recorder.fed == events and recorder.committed == (200, [("content-type", "text/event-stream")])

    r = rig({"a": [Reply(status=404, body=[b"{}"])]})
    await r.forward(CHAT, CacheLookup(CacheStatus.MISS, key="k"))
    assert r.cache.recorders[0].aborted and r.cache.recorders[0].committed is None

    r = rig({"a": [Reply()]})
    await r.forward(CHAT, CacheLookup(CacheStatus.BYPASS))
    assert r.cache.recorders == []  # only a MISS is recorded


async def test_a_cancelled_request_closes_the_upstream_and_frees_the_backend() -> None:
    r = rig({"a": [Reply(headers=list(SSE), body=[b"data: 1\n\n", 5.0, b"data: 2\n\n"])]})
    task = asyncio.ensure_future(r.forward(STREAM))
    while not r.transports["a"].responses:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert r.transports["a"].responses[0].closed
    assert r.pool.get("a").local_in_flight == 0  # type: ignore[union-attr]
    assert r.counter("continuum_backend_requests_total", backend="a", outcome="cancelled") == 1
