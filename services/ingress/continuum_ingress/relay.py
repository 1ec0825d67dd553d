"""Relaying an upstream answer: the headers the client gets, a stream's first chunk read
ahead of the client's response, and the sink that writes the rest of a stream from the upstream
connection's callbacks (continuum_ingress/forwarding.py uses them)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from continuum_ingress.asgi import Channel, Relay
    from continuum_ingress.hooks import ResponseRecorder
    from continuum_ingress.protocol.dialects import ResponseTranslator
    from continuum_ingress.state import RequestState
    from continuum_ingress.transport import UpstreamResponse

_DROP_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"date",
        b"server",
    }
)


def relay_headers(upstream: list[tuple[bytes, bytes]], backend: str, request_id: str) -> list[tuple[bytes, bytes]]:
    """An upstream answer's headers for the client: hop-by-hop and framing headers dropped, the
    backend that answered and the request id added."""
    out = [(k, v) for k, v in upstream if k not in _DROP_HEADERS]
    out.append((b"x-continuum-backend", backend.encode()))
    out.append((b"x-request-id", request_id.encode()))
    return out


def response_headers(
    upstream: list[tuple[bytes, bytes]], state: RequestState, backend: str
) -> list[tuple[bytes, bytes]]:
    out = relay_headers(upstream, backend, state.request_id)
    out.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in state.cache_headers)
    return out


def stream_headers(response: UpstreamResponse, state: RequestState, backend: str) -> list[tuple[bytes, bytes]]:
    headers = response_headers(response.headers, state, backend)
    headers.append((b"x-accel-buffering", b"no"))
    return headers


class FirstChunk:
    """A stream's first body chunk, read before the client's response starts, and the rest.

    `translator` is the backend dialect's translator for this answer (None when the dialect
    has none); `sent` is what the first chunk became for the client when it was already written
    from the upstream connection's callback (None when the forwarder writes it), with the stage
    clock's times of its arrival and of the end of its write."""

    __slots__ = ("_first", "_rest", "arrived_at", "sent", "translator", "written_at")

    def __init__(
        self,
        first: bytes | None,
        rest: AsyncIterator[bytes],
        translator: ResponseTranslator | None = None,
        *,
        sent: bytes | None = None,
        arrived_at: float = 0.0,
        written_at: float = 0.0,
    ) -> None:
        self._first = first
        self._rest = rest
        self.translator = translator
        self.sent = sent
        self.arrived_at = arrived_at
        self.written_at = written_at

    @property
    def first(self) -> bytes | None:
        return self._first

    @classmethod
    async def read(cls, response: UpstreamResponse, translator: ResponseTranslator | None = None) -> FirstChunk:
        rest = response.stream()
        try:
            first: bytes | None = await anext(rest)
        except StopAsyncIteration:
            first = None  # a stream with an empty body
        return cls(first, rest, translator)

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._first is None:
            return
        yield self._first
        async for chunk in self._rest:
            yield chunk


class FirstChunkSink:
    """A stream's first chunk, written to the client from the upstream connection's callback
    the moment it is parsed (a transport's `pump(sink, once=True)`), instead of after the
    request's task has woken. Takes it only while the first-byte deadline can still be
    disarmed (once it has expired the forwarder is retrying, and nothing may reach the
    client) and the client is reading; keeps what the task still has to do with it."""

    __slots__ = ("_clock", "_deadline", "_out", "_translator", "arrived_at", "raw", "sent", "written_at")

    def __init__(
        self, out: Relay, translator: ResponseTranslator | None, deadline: Disarmable, clock: Callable[[], float]
    ) -> None:
        self._out = out
        self._translator = translator
        self._deadline = deadline
        self._clock = clock
        self.raw: bytes | None = None
        self.sent = b""
        self.arrived_at = self.written_at = 0.0

    def __call__(self, raw: bytes) -> bool:
        if not self._out.relay_ready() or not self._deadline.disarm():
            return False
        self.arrived_at = self._clock()
        chunk = raw if self._translator is None else self._translator.chunk(raw)
        if chunk:
            self._out.relay(chunk)
        self.written_at = self._clock()
        self.raw, self.sent = raw, chunk
        return True

    def first_chunk(self, rest: AsyncIterator[bytes], translator: ResponseTranslator | None) -> FirstChunk | None:
        """The FirstChunk for the forwarder once this took one, else None."""
        if self.raw is None:
            return None
        return FirstChunk(
            self.raw, rest, translator, sent=self.sent, arrived_at=self.arrived_at, written_at=self.written_at
        )


async def read_first_chunk(
    response: UpstreamResponse,
    channel: Channel,
    *,
    own: ResponseTranslator | None,
    translator: ResponseTranslator | None,
    deadline: Disarmable,
    clock: Callable[[], float],
) -> FirstChunk:
    """A successful stream's first chunk. Written to the client from the upstream connection's
    callback the moment it arrives when both ends allow it: no wait for the request's task to
    wake, which may find a whole turn of the loop's work queued before it. Else read here, for
    the forwarder to write. `own` is the dialect's translator, `translator` what the chunk goes
    through (the dialect's, or a filter of the answer)."""
    pump = pump_of(response, channel)
    if pump is not None:
        sink = FirstChunkSink(pump.relay, translator, deadline, clock)
        await pump.pump(sink, once=True)
        first = sink.first_chunk(response.stream(), own)
        if first is not None:
            return first
    return await FirstChunk.read(response, own)


class Disarmable(Protocol):
    def disarm(self) -> bool: ...


class Pump:
    """A response's `pump` and the client's `Relay`, when both ends have them."""

    __slots__ = ("pump", "relay")

    def __init__(self, pump: Callable[..., Awaitable[None]], relay: Relay) -> None:
        self.pump = pump
        self.relay = relay


def pump_of(response: UpstreamResponse, channel: Channel) -> Pump | None:
    """How to relay a stream from the upstream connection's callbacks: both the client's
    server and the upstream transport must support it (the router's own server and the h1
    pool do), else None."""
    pump = getattr(response, "pump", None)
    if pump is None or channel.relay is None:
        return None
    return Pump(pump, channel.relay)


class ChunkSink:
    """A stream's chunks, from the upstream connection's callbacks (a transport's `pump`) to
    the client: translated, written at once, then copied to the recorder, as the forwarder's
    loop does for each chunk but without a coroutine waking. Refuses (False, nothing done)
    while the client is not reading: the forwarder's loop then waits for it."""

    __slots__ = ("_out", "_recorder", "_translator")

    def __init__(self, out: Relay, translator: ResponseTranslator | None, recorder: ResponseRecorder | None) -> None:
        self._out = out
        self._translator = translator
        self._recorder = recorder

    def __call__(self, raw: bytes) -> bool:
        out = self._out
        if not out.relay_ready():
            return False
        chunk = raw if self._translator is None else self._translator.chunk(raw)
        if chunk:
            out.relay(chunk)
            if self._recorder is not None:  # a copy, after the client has it
                self._recorder.feed(chunk)
        return True


def text_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k not in _DROP_HEADERS]
