"""Relaying an upstream answer: the headers the client gets, a stream's first chunk read
ahead of the client's response, and the sink that writes the rest of a stream from the upstream
connection's callbacks (continuum_ingress/forwarding.py uses them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from continuum_ingress.asgi import Relay
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
    """A stream's first body chunk, read before the client's response starts, and the rest."""

    __slots__ = ("_first", "_rest")

    def __init__(self, first: bytes | None, rest: AsyncIterator[bytes]) -> None:
        self._first = first
        self._rest = rest

    @property
    def first(self) -> bytes | None:
        return self._first

    @classmethod
    async def read(cls, response: UpstreamResponse) -> FirstChunk:
        rest = response.stream()
        try:
            first: bytes | None = await anext(rest)
        except StopAsyncIteration:
            first = None  # a stream with an empty body
        return cls(first, rest)

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._first is None:
            return
        yield self._first
        async for chunk in self._rest:
            yield chunk


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
