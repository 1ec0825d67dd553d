"""The HTTP edge over real sockets: header size (431), header-read, body-read and idle timeouts
(408 / close), the per-client connection cap (429), each counted; the router keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import orjson

from continuum_testing.ingress_harness import RunningIngress, running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

BODY = orjson.dumps({"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]})
LIMITS = {
    "max_header_bytes": 4096,
    "header_timeout": "300ms",
    "body_timeout": "300ms",
    "keepalive_timeout": "1s",
    "max_connections_per_client": 4,
}


@contextlib.asynccontextmanager
async def edge_ingress(**server: object) -> AsyncIterator[RunningIngress]:
    async with running_stubs("a") as stubs:
        cfg = {"server": {**LIMITS, **server}, "backends": stub_backends(stubs)}
        async with running_ingress(cfg) as ing:
            yield ing


async def connect(ing: RunningIngress) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", ing.server.port)


async def answer(reader: asyncio.StreamReader, timeout: float = 5.0) -> tuple[int, bytes]:
    """Status and the rest of what the server sent until it closed the connection."""
    data = await asyncio.wait_for(reader.read(), timeout)
    if not data:
        return 0, b""
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


async def rejections(ing: RunningIngress) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=ing.url, timeout=5) as c:
        text = (await c.get("/metrics")).text
    out = {}
    for line in text.splitlines():
        if line.startswith("continuum_ingress_edge_rejections_total{"):
            key, _, value = line.rpartition(" ")
            out[key.split('"')[1]] = float(value)
    return out


async def still_serves(ing: RunningIngress) -> None:
    async with httpx.AsyncClient(base_url=ing.url, timeout=5) as c:
        r = await c.post("/v1/chat/completions", content=BODY, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def request_head(extra: bytes = b"", length: int = len(BODY)) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + extra
        + b"content-length: %d\r\n\r\n" % length
    )


async def test_a_header_over_the_limit_is_431_with_an_error_body() -> None:
    async with edge_ingress() as ing:
        # A complete head just over the limit (parsed size) and one that never ends (raw bytes).
        for head in (
            request_head(b"x-big: " + b"a" * 5000 + b"\r\n") + BODY,
            request_head(b"x-big: " + b"a" * 200_000),
        ):
            reader, writer = await connect(ing)
            writer.write(head)
            status, body = await answer(reader)
            writer.close()
            assert status == 431
            error = orjson.loads(body)["error"]
            assert error["code"] == "header_too_large" and "4096" in error["message"]
        # Under the limit is fine.
        reader, writer = await connect(ing)
        writer.write(request_head(b"x-ok: " + b"a" * 3000 + b"\r\n").replace(b"HTTP/1.1", b"HTTP/1.0") + BODY)
        status, _ = await answer(reader)
        writer.close()
        assert status == 200
        await still_serves(ing)
        assert (await rejections(ing))["header_too_large"] == 2
    assert ing.app.edge.open_connections == 0


async def test_a_head_that_trickles_past_the_header_timeout_is_408() -> None:
    async with edge_ingress() as ing:
        reader, writer = await connect(ing)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        status, body = await answer(reader, timeout=3)
        writer.close()
        assert status == 408 and orjson.loads(body)["error"]["code"] == "header_timeout"
        await still_serves(ing)
        assert (await rejections(ing))["header_timeout"] == 1


async def test_a_connection_that_never_sends_is_closed() -> None:
    async with edge_ingress() as ing:
        reader, writer = await connect(ing)
        assert await asyncio.wait_for(reader.read(), 3) == b""  # closed, nothing sent
        writer.close()
        assert (await rejections(ing))["idle_timeout"] == 1


async def test_a_body_shorter_than_its_content_length_is_408_and_the_backend_never_sees_it() -> None:
    async with running_stubs("a") as stubs:
        cfg = {"server": LIMITS, "backends": stub_backends(stubs)}
        async with running_ingress(cfg) as ing:
            reader, writer = await connect(ing)
            writer.write(request_head(length=len(BODY) + 10) + BODY)
            loop = asyncio.get_running_loop()
            started = loop.time()
            status, body = await answer(reader, timeout=3)
            writer.close()
            assert status == 408 and orjson.loads(body)["error"]["code"] == "body_timeout"
            assert loop.time() - started < 2.5
            await still_serves(ing)
            assert (await rejections(ing))["body_timeout"] == 1
        assert len(stubs[0].stub.requests) == 1  # only the still_serves request


async def test_a_slow_but_steady_body_is_not_cut() -> None:
    async with edge_ingress() as ing:
        reader, writer = await connect(ing)
        writer.write(request_head().replace(b"HTTP/1.1", b"HTTP/1.0"))
        for i in range(0, len(BODY), 8):  # 8 bytes every 100 ms: much longer than body_timeout in all
            writer.write(BODY[i : i + 8])
            await asyncio.sleep(0.1)
        status, _ = await answer(reader)
        writer.close()
        assert status == 200
        assert "body_timeout" not in {k for k, v in (await rejections(ing)).items() if v}


async def test_kept_alive_connection_closes_after_the_idle_timeout() -> None:
    async with edge_ingress() as ing:
        reader, writer = await connect(ing)
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
        await reader.readexactly(length)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # keepalive_timeout 1s
        assert 0.5 < loop.time() - started < 4
        writer.close()


async def test_a_connection_answered_before_its_body_ended_still_closes_when_idle() -> None:
    # 413 is answered from the head alone; the body that follows is read and dropped, and then
    # the connection is idle like any other
    async with edge_ingress(max_body_bytes=1024) as ing:
        reader, writer = await connect(ing)
        writer.write(request_head(length=2000))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert head.startswith(b"HTTP/1.1 413")
        writer.write(b" " * 2000)
        loop = asyncio.get_running_loop()
        started = loop.time()
        rest = await asyncio.wait_for(reader.read(), 5)  # keepalive_timeout 1s
        assert rest.endswith(b"}") and 0.5 < loop.time() - started < 4
        writer.close()


async def test_the_per_client_connection_cap_is_429_and_frees_with_closes() -> None:
    async with edge_ingress(header_timeout="5s") as ing:
        held = [await connect(ing) for _ in range(4)]
        await asyncio.sleep(0.1)
        assert ing.app.edge.connections_of("127.0.0.1") == 4
        reader, writer = await connect(ing)
        status, body = await answer(reader)
        writer.close()
        assert status == 429 and orjson.loads(body)["error"]["code"] == "client_connections"
        for _, w in held:
            w.close()
        for _ in range(50):
            if ing.app.edge.connections_of("127.0.0.1") == 0:
                break
            await asyncio.sleep(0.05)
        await still_serves(ing)  # room again
        assert (await rejections(ing))["client_connections"] == 1


async def test_bytes_that_are_not_http_get_a_json_400() -> None:
    async with edge_ingress() as ing:
        reader, writer = await connect(ing)
        writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")
        status, body = await answer(reader)
        writer.close()
        assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_http"
        await still_serves(ing)
        assert (await rejections(ing))["invalid_http"] == 1
