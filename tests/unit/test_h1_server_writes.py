"""The router's HTTP/1.1 protocol writes a small response as one send, a stream's head at the end
of the loop turn, and a large body without copying it behind the head (a recording transport)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from continuum_ingress.adapters.h1_server import DefaultHeaders, H1ServerProtocol
from continuum_ingress.asgi import RESPOND, Channel
from continuum_ingress.edge import EdgeGuard, EdgeLimits


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.sends.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.sends.append(b"|".join(bytes(p) for p in parts))  # one call, parts kept apart

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5000) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def serve_one(
    app: Any,
    request: bytes = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
    seconds: float = 0.0,
    transport: Recording | None = None,
) -> list[bytes]:
    """What the protocol sent for one request: the loop runs `seconds` (or a few turns)."""
    state = SimpleNamespace(connections=set(), tasks=set(), default_headers=[(b"date", b"today")], total_requests=0)
    config = SimpleNamespace(loaded=True, loaded_app=app)
    guard = EdgeGuard(EdgeLimits(), CollectorRegistry())
    protocol = H1ServerProtocol(config, state, {}, asyncio.get_running_loop(), guard=guard, defaults=DefaultHeaders())
    transport = transport or Recording()
    protocol.connection_made(transport)
    protocol.data_received(request)
    if seconds:
        await asyncio.sleep(seconds)
    for _ in range(20):
        await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport.sends


async def whole(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"hi"})


async def test_a_small_response_is_one_send_with_the_default_headers() -> None:
    sends = await serve_one(whole)
    assert sends == [b"HTTP/1.1 200 OK\r\ndate: today\r\ncontent-length: 2\r\n\r\nhi"]


async def test_a_stream_head_leaves_before_its_first_chunk() -> None:
    gate = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await gate.wait()  # the first token takes a while
        await send({"type": "http.response.body", "body": b"tok"})

    asyncio.get_running_loop().call_later(0.05, gate.set)
    sends = await serve_one(stream, seconds=0.1)
    assert sends[0].startswith(b"HTTP/1.1 200 OK\r\n") and sends[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    assert sends[1] == b"3\r\ntok\r\n0\r\n\r\n"


async def test_a_large_body_is_written_beside_its_head() -> None:
    body = b"x" * 100_000

    async def large(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100000")]})
        await send({"type": "http.response.body", "body": body})

    sends = await serve_one(large)
    assert len(sends) == 1
    head, _, rest = sends[0].partition(b"|")
    assert head.endswith(b"\r\n\r\n") and rest == body


async def test_the_scope_s_respond_sends_a_whole_response_as_the_two_messages_would() -> None:
    results: list[bool] = []

    async def responding(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        respond = scope[RESPOND]
        results.append(respond(200, [(b"content-length", b"2")], b"hi"))
        results.append(respond(200, [(b"content-length", b"2")], b"hi"))  # already answered: refused

    sends = await serve_one(responding)
    assert sends == [b"HTTP/1.1 200 OK\r\ndate: today\r\ncontent-length: 2\r\n\r\nhi"]
    assert results == [True, False]


async def test_respond_refuses_while_writes_are_paused_and_the_channel_falls_back_to_send() -> None:
    outcome: list[object] = []

    async def paused(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        conn = scope[RESPOND].__self__.conn
        conn.pause_writing()  # the client reads slowly
        outcome.append(scope[RESPOND](200, [(b"content-length", b"2")], b"hi"))
        asyncio.get_running_loop().call_later(0.02, conn.resume_writing)
        channel = Channel(send, scope[RESPOND])
        await channel.whole(200, [], b"ok")  # waits for the drain through send()
        outcome.append((channel.started, channel.finishing, channel.status))

    sends = await serve_one(paused, seconds=0.05)
    assert outcome == [False, (True, True, 200)]
    assert sends == [b"HTTP/1.1 200 OK\r\ndate: today\r\ncontent-length: 2\r\n\r\nok"]


async def test_a_flushed_chunk_is_written_at_once_with_what_the_turn_queued() -> None:
    """A relayed stream chunk (`Channel.body(..., flush=True)`) leaves during the send itself,
    with the head queued before it; an unflushed one waits for the end of the turn."""
    seen: list[list[bytes]] = []
    transport = Recording()

    async def relay(scope: Any, receive: Any, send: Any) -> None:
        channel = Channel(send)
        await channel.start(200, [])
        await channel.body(b"role", more=True, flush=True)
        seen.append(list(transport.sends))  # no loop turn since: written during the send
        await channel.body(b"late", more=True)
        seen.append(list(transport.sends))  # not yet: the end of the turn writes it
        await channel.body(b"", more=False)

    sends = await serve_one(relay, transport=transport)
    head = seen[0][0]
    assert len(seen[0]) == 1 and head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n4\r\nrole\r\n")
    assert seen[1] == seen[0], "an unflushed chunk waits for the end of the loop's turn"
    assert sends[1] == b"4\r\nlate\r\n0\r\n\r\n"
