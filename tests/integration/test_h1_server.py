"""The router's HTTP/1.1 server protocol (adapters/h1_server.py) over real loopback sockets, with a
small ASGI app: framing both ways, pipelining, 100-continue, HEAD, keep-alive and close, request
body flow control, app errors, header injection, disconnects, and the graceful drain."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from prometheus_client import CollectorRegistry

from continuum_ingress.asgi import DISCONNECT_HOOK
from continuum_ingress.edge import EdgeGuard, EdgeLimits
from continuum_ingress.server import RunningServer

Scope = dict[str, Any]


class App:
    """Routes by path; records what it saw."""

    def __init__(self) -> None:
        self.after_body: list[str] = []
        self.release = asyncio.Event()
        self.hooks: list[object] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.hooks.append(scope.get(DISCONNECT_HOOK))
        path = scope["path"]
        body, messages = b"", 0
        while True:
            message = await receive()
            messages += 1
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if path == "/echo":
            info = {
                "method": scope["method"],
                "size": len(body),
                "messages": messages,
                "query": scope["query_string"].decode(),
            }
            data = orjson.dumps({**info, "sha": hash(body)})
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(data))]}
            )
            await send({"type": "http.response.body", "body": data})
        elif path == "/stream":  # no content-length: chunked
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            for i in range(3):
                await send({"type": "http.response.body", "body": b"part%d;" % i, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/big":
            data = bytes(range(256)) * 32768  # 8 MiB
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(data))]}
            )
            await send({"type": "http.response.body", "body": data})
        elif path == "/boom":
            raise ValueError("a bug")
        elif path == "/inject":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1\r\nset-cookie: x")]})
        elif path == "/slow":
            await self.release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
        elif path == "/wait-disconnect":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"started", "more_body": True})
            self.after_body.append((await receive())["type"])
        else:
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def serving(app: App, **limits: Any) -> AsyncIterator[RunningServer]:
    guard = EdgeGuard(EdgeLimits(**limits), CollectorRegistry())
    async with RunningServer(app, edge=guard) as server:
        yield server


async def exchange(server: RunningServer, data: bytes, *, until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(data)
    try:
        if until_close:
            return await asyncio.wait_for(reader.read(), 5)
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n%s\r\n%s" % (path, len(body), extra, body)


async def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    async with serving(App()) as server:
        data = post(b"/echo?n=1", b"a" * 10) + post(b"/echo?n=2", b"b" * 20) + post(b"/stream", b"")
        data += b"GET /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        raw = await exchange(server, data)
    answers = raw.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert len(answers) == 4
    assert b'"size":10' in answers[0] and b'"query":"n=1"' in answers[0]
    assert b'"size":20' in answers[1]
    assert b"transfer-encoding: chunked" in answers[2] and b"6\r\npart0;\r\n" in answers[2]
    assert answers[2].endswith(b"0\r\n\r\n")
    assert b"connection: close" in answers[3] and b'"method":"GET"' in answers[3]


async def test_a_chunked_request_body_arrives_whole_and_a_chunked_response_decodes() -> None:
    async with serving(App()) as server, httpx.AsyncClient(base_url=server.url, timeout=5) as client:

        async def parts() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"x" * 1000

        echoed = (await client.post("/echo", content=parts())).json()
        streamed = await client.get("/stream")
    assert echoed["size"] == 5000
    assert streamed.headers["transfer-encoding"] == "chunked"
    assert streamed.text == "part0;part1;part2;"


async def test_a_large_body_is_received_under_flow_control_and_a_large_answer_is_sent_whole() -> None:
    body = bytes(range(256)) * 8192  # 2 MiB: past the 64 KiB read pause many times over
    async with serving(App()) as server, httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        echoed = (await client.post("/echo", content=body)).json()
        big = await client.get("/big")
    assert echoed["size"] == len(body) and echoed["sha"] == hash(body)
    assert echoed["messages"] > 1  # handed over as it arrived, not buffered whole
    assert big.content == bytes(range(256)) * 32768


async def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async with serving(App()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(b"hello")
        final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert final.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_head_gets_the_length_but_no_body_and_http_1_0_is_closed() -> None:
    async with serving(App()) as server:
        head = await exchange(server, b"HEAD /echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        old = await exchange(server, b"GET /echo HTTP/1.0\r\n\r\n")
    status, _, rest = head.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200") and b"content-length:" in status and rest == b""
    assert old.startswith(b"HTTP/1.1 200") and b"connection: close" in old  # and read() returned: closed


async def test_an_app_error_is_a_500_json_and_the_server_keeps_serving() -> None:
    async with serving(App()) as server, httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        boom = await client.get("/boom")
        injected = await client.get("/inject")
        fine = await client.post("/echo", content=b"ok")
    assert boom.status_code == 500 and boom.json()["error"]["code"] == "internal_error"
    assert injected.status_code == 500 and "set-cookie" not in injected.headers  # the head was never written
    assert fine.status_code == 200


async def test_receive_after_the_body_waits_for_the_disconnect() -> None:
    app = App()
    async with serving(app) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /wait-disconnect HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"started"), 5)
        assert app.after_body == []  # still waiting
        writer.close()
        for _ in range(100):
            if app.after_body:
                break
            await asyncio.sleep(0.02)
    assert app.after_body == ["http.disconnect"]
    assert all(hook is not None for hook in app.hooks)  # the edge's disconnect hook is in every scope


async def test_the_drain_finishes_a_request_in_flight_and_closes_idle_connections() -> None:
    app = App()
    guard = EdgeGuard(EdgeLimits(), CollectorRegistry())
    server = RunningServer(app, edge=guard)
    await server.start()
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
    idle_writer.write(post(b"/echo", b""))
    await asyncio.wait_for(idle_reader.readuntil(b"}"), 5)
    busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", server.port)
    busy_writer.write(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
    await asyncio.sleep(0.1)
    stopping = asyncio.create_task(server.stop())
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # the idle connection is closed
    app.release.set()
    answer = await asyncio.wait_for(busy_reader.read(), 5)  # answered, then closed
    await asyncio.wait_for(stopping, 10)
    idle_writer.close()
    busy_writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer and answer.endswith(b"ok")
