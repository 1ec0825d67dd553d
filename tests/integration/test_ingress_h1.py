"""The ingress's pooled HTTP/1.1 client against small raw servers on loopback: body framings,
keep-alive reuse, a server closing idle connections, pool limits, timeouts and garbage."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from continuum_ingress.adapters.h1 import ConnectFailed, Disconnected, H1Pool, Outbox, ReadTimeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server running `handler` per connection; yields its URL and a connection counter."""
    connections: list[int] = []

    async def wrapped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(wrapped, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", connections


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def pool(url: str, **kw: float) -> H1Pool:
    return H1Pool(
        url,
        connect_timeout=kw.get("connect", 1.0),
        read_timeout=kw.get("read", 2.0),
        max_connections=int(kw.get("max_connections", 8)),
    )


async def test_content_length_chunked_and_until_close_bodies() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        if b"POST /length" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello")
            request = await read_request(reader)  # keep-alive: a second request on this connection
        if b"/chunked" in request:
            writer.write(b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in (b"ab", b"cde", b""):
                writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                await writer.drain()
            request = await read_request(reader)
        if b"/close" in request:
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
            await writer.drain()
            writer.close()

    async with raw_server(handler) as (url, connections):
        p = pool(url)
        r = await p.request("POST", "/length", [("content-type", "application/json")], b"{}")
        assert (r.status, await r.read()) == (200, b"hello") and (b"x-a", b"1") in r.headers
        await r.aclose()
        r = await p.request("POST", "/chunked", [], b"{}")
        assert r.status == 201 and await r.read() == b"abcde"
        await r.aclose()
        r = await p.request("POST", "/close", [], b"{}")
        assert await r.read() == b"until the end"
        await r.aclose()
        assert len(connections) == 1  # all three on one kept-alive connection
        assert p.open_connections == 0  # the close-delimited one is not reused
        await p.aclose()


async def test_a_connection_the_server_closed_while_idle_is_replaced_transparently() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        # Answers as if keep-alive, then drops the connection without a word (an idle timeout).
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.transport.abort()

    async with raw_server(handler) as (url, connections):
        p = pool(url)
        for _ in range(3):
            r = await p.request("POST", "/x", [], b"{}")
            assert await r.read() == b"ok"
            await r.aclose()
        assert len(connections) == 3
        await p.aclose()


async def test_pool_limit_waits_then_times_out() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx")
            await writer.drain()

    async with raw_server(handler) as (url, connections):
        p = pool(url, max_connections=1, connect=0.2)
        first = asyncio.create_task(p.request("POST", "/a", [], b"1"))
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectFailed, match="no free connection"):
            await p.request("POST", "/b", [], b"2")
        second = asyncio.create_task(p.request("POST", "/c", [], b"3"))
        await asyncio.sleep(0.05)
        release.set()
        r1 = await first
        assert await r1.read() == b"x"
        await r1.aclose()  # frees the connection for the waiter
        r2 = await second
        assert await r2.read() == b"x"
        await r2.aclose()
        assert len(connections) == 1
        await p.aclose()


async def test_read_timeout_refused_connection_and_garbage() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async with raw_server(silent) as (url, _):
        p = pool(url, read=0.2)
        with pytest.raises(ReadTimeout):
            await p.request("POST", "/x", [], b"{}")
        assert p.open_connections == 0
        await p.aclose()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with raw_server(garbage) as (url, _):
        p = pool(url)
        with pytest.raises(Disconnected, match="invalid HTTP"):
            await p.request("POST", "/x", [], b"{}")
        await p.aclose()

    async with raw_server(silent) as (url, _):
        pass  # the server is gone: its port refuses connections now
    p = pool(url)
    with pytest.raises(ConnectFailed):
        await p.request("POST", "/x", [], b"{}")


async def test_large_stream_is_reassembled_under_flow_control_and_an_early_close_drops_the_connection() -> None:
    part = b"y" * 65536
    sent: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(512):  # 32 MiB: more than the 1 MiB pause threshold plus kernel buffers
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
            sent.append(1)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await read_request(reader)

    async with raw_server(handler) as (url, _):
        p = pool(url)
        r = await p.request("POST", "/big", [], b"{}")
        await asyncio.sleep(0.3)  # a slow consumer: the server must be held back, not buffered
        assert len(sent) < 512
        total = 0
        async for chunk in r.stream():
            total += len(chunk)
        assert total == 512 * len(part)
        await r.aclose()
        assert p.open_connections == 1  # complete: kept for reuse
        r = await p.request("POST", "/big", [], b"{}")
        async for _ in r.stream():
            break
        await r.aclose()  # unfinished: the connection is closed, not reused
        assert p.open_connections == 0
        await p.aclose()


async def test_https_backend_with_certificate_verification(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecure")
        await writer.drain()
        await read_request(reader)

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with server:
        trusting = ssl.create_default_context(cafile=str(cert))
        p = H1Pool(
            f"https://localhost:{port}", connect_timeout=2, read_timeout=2, max_connections=2, tls_context=trusting
        )
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        assert await r.read() == b"secure"
        await r.aclose()
        await p.aclose()
        # The default trust store does not know this certificate: the connection is refused.
        strict = H1Pool(f"https://localhost:{port}", connect_timeout=2, read_timeout=2, max_connections=2)
        with pytest.raises(ConnectFailed, match=r"CERTIFICATE_VERIFY_FAILED|SSL"):
            await strict.request("POST", "/v1/chat/completions", [], b"{}")


async def test_pools_sharing_an_outbox_answer_every_concurrent_request() -> None:
    """Requests posted in one turn leave together at its end; each still gets its own answer."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            path = request.split(b" ")[1]
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(path), path))

    async with raw_server(handler) as (url, _):
        outbox = Outbox()
        pools = [H1Pool(url, connect_timeout=1.0, read_timeout=2.0, max_connections=8, outbox=outbox) for _ in range(2)]

        async def one(i: int) -> bytes:
            r = await pools[i % 2].request("POST", f"/r{i}", [], b"{}")
            try:
                return await r.read()
            finally:
                await r.aclose()

        for _ in range(3):  # fresh connections, then reused ones
            answers = await asyncio.gather(*(one(i) for i in range(40)))
            assert answers == [f"/r{i}".encode() for i in range(40)]
        assert all(p.open_connections == 8 for p in pools)
        for p in pools:
            await p.aclose()
