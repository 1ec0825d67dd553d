"""`Response.pump`: a streamed body handed to a sink from the connection's callbacks, against
raw servers on loopback. Chunks in order and none twice, a sink that refuses (the rest stays for
`stream()`), the idle timeout, a server that hangs up, a sink that raises, and reuse of the
connection afterwards."""

from __future__ import annotations

import asyncio

import pytest

from continuum_ingress.adapters.h1 import Disconnected, ReadTimeout
from tests.integration.test_ingress_h1 import pool, raw_server, read_request

CHUNKS = [f"event {i};".encode() for i in range(40)]


def chunked_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def frame(part: bytes) -> bytes:
    return f"{len(part):x}\r\n".encode() + part + b"\r\n"


def dechunk(data: bytes) -> bytes:
    """A chunked HTTP/1.1 body, its framing taken off."""
    out, at = bytearray(), 0
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


async def send_events(writer: asyncio.StreamWriter, parts: list[bytes], gap: float = 0.002) -> None:
    """Each part in its own write, `gap` apart, as an engine streams tokens."""
    for part in parts:
        writer.write(frame(part))
        await writer.drain()
        await asyncio.sleep(gap)


async def streaming_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Every request on the connection gets the 40 events, then the end of the body."""
    while True:
        await read_request(reader)
        writer.write(chunked_head())
        await send_events(writer, CHUNKS)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def test_pumped_chunks_arrive_in_order_and_the_connection_is_reused() -> None:
    async with raw_server(streaming_handler) as (url, connections):
        p = pool(url)
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        got: list[bytes] = []

        def sink(chunk: bytes) -> bool:
            got.append(chunk)
            return True

        first = await anext(r.stream())  # the first chunk through the task, as the forwarder does
        await r.pump(sink)
        rest = [chunk async for chunk in r.stream()]  # ends at once: the pump took it all
        await r.aclose()
        assert rest == []
        assert first + b"".join(got) == b"".join(CHUNKS)
        assert len(got) >= 10  # handed over piece by piece as they came, not in one lump at the end

        # the same connection serves the next request, with no sink left on it
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        assert await r.read() == b"".join(CHUNKS)
        await r.aclose()
        await p.aclose()
    assert len(connections) == 1


async def test_a_refused_chunk_and_everything_after_it_stay_for_stream() -> None:
    async with raw_server(streaming_handler) as (url, _):
        p = pool(url)
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        taken: list[bytes] = []

        def sink(chunk: bytes) -> bool:
            if len(taken) == 5:
                return False  # the client stopped reading: nothing done with this chunk
            taken.append(chunk)
            return True

        await r.pump(sink)
        assert len(taken) == 5
        rest = [chunk async for chunk in r.stream()]
        await r.aclose()
        await p.aclose()
    assert b"".join(taken) + b"".join(rest) == b"".join(CHUNKS)


async def test_chunks_buffered_before_the_pump_starts_go_to_the_sink_first() -> None:
    async with raw_server(streaming_handler) as (url, _):
        p = pool(url)
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        await asyncio.sleep(0.05)  # several events arrive and wait in the connection's buffer
        got: list[bytes] = []
        await r.pump(lambda chunk: got.append(chunk) is None)
        assert [chunk async for chunk in r.stream()] == []
        await r.aclose()
        await p.aclose()
    assert b"".join(got) == b"".join(CHUNKS)


async def test_silence_while_pumping_is_a_read_timeout_after_the_chunks_before_it() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head())
        await send_events(writer, CHUNKS[:3])
        await asyncio.sleep(5)  # then nothing

    async with raw_server(handler) as (url, _):
        p = pool(url, read=0.3)
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        await r.pump(lambda chunk: got.append(chunk) is None)
        waited = loop.time() - started
        with pytest.raises(ReadTimeout):
            await anext(r.stream())
        await r.aclose()
        await p.aclose()
    assert b"".join(got) == b"".join(CHUNKS[:3])
    assert 0.25 < waited < 2.0  # measured from the last bytes, not from each chunk's own timer


async def test_a_server_hanging_up_mid_stream_is_disconnected() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head())
        await send_events(writer, CHUNKS[:4])
        writer.close()

    async with raw_server(handler) as (url, _):
        p = pool(url)
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        got: list[bytes] = []
        await r.pump(lambda chunk: got.append(chunk) is None)
        with pytest.raises(Disconnected):
            await anext(r.stream())
        await r.aclose()
        await p.aclose()
    assert b"".join(got) == b"".join(CHUNKS[:4])


async def test_a_sink_that_raises_raises_from_pump_and_the_connection_is_not_reused() -> None:
    async with raw_server(streaming_handler) as (url, connections):
        p = pool(url)
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        await anext(r.stream())
        calls = 0

        def sink(chunk: bytes) -> bool:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise ValueError("translator failed")
            return True

        with pytest.raises(ValueError, match="translator failed"):
            await r.pump(sink)
        await r.aclose()  # before its end: the connection is closed, not pooled
        assert calls == 3
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        assert await r.read() == b"".join(CHUNKS)
        await r.aclose()
        await p.aclose()
    assert len(connections) == 2


async def test_cancelling_a_pump_detaches_its_sink() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head())
        await send_events(writer, CHUNKS, gap=0.02)

    async with raw_server(handler) as (url, _):
        p = pool(url)
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        got: list[bytes] = []
        task = asyncio.create_task(r.pump(lambda chunk: got.append(chunk) is None))
        await asyncio.sleep(0.1)
        task.cancel()  # the client left: the forwarder's task is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        seen = len(got)
        await asyncio.sleep(0.1)
        assert len(got) == seen  # nothing reaches the sink after its pump ended
        await r.aclose()
        await p.aclose()
    assert 0 < seen < len(CHUNKS)


async def test_a_slow_client_gets_every_byte_of_a_large_stream_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the ingress: a backend streams ~10 MB as fast as it can, the client reads slowly.
    Chunks the client cannot take yet are refused by the callback path and relayed by the
    forwarder's loop after the client drained, then the callback path resumes."""
    from continuum_ingress.adapters.h1_cycle import RequestCycle
    from continuum_testing.ingress_harness import running_ingress

    refused = 0
    ready = RequestCycle.relay_ready

    def counting(self: RequestCycle) -> bool:
        nonlocal refused
        ok = ready(self)
        refused += not ok
        return ok

    monkeypatch.setattr(RequestCycle, "relay_ready", counting)
    parts = [b"data: %06d " % i + b"x" * 16_000 + b"\n\n" for i in range(600)]

    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            if request.startswith(b"GET"):  # health checks
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                continue
            writer.write(chunked_head())
            for part in parts:
                writer.write(frame(part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with raw_server(backend) as (url, _):
        config = {"backends": [{"name": "a", "url": url, "type": "vllm", "models": ["m"]}]}
        async with running_ingress(config) as ing:
            host, port = ing.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 16)
            body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
            received = bytearray()
            while not received.endswith(b"\r\n0\r\n\r\n"):
                received += await asyncio.wait_for(reader.read(1 << 16), 10)
                await asyncio.sleep(0.001)  # a slow reader
            writer.close()
    text = dechunk(bytes(received))
    numbers = [int(text[i + 6 : i + 12]) for i in range(len(text)) if text.startswith(b"data: ", i)]
    assert numbers == list(range(600))  # every event, once, in order
    assert text.count(b"x" * 16_000) == 600
    assert refused > 0  # the slow client made the callback path hand over to the loop


async def test_the_chunks_of_one_read_reach_the_sink_as_one_piece() -> None:
    """A backend that writes many events at once: one write to the client for the lot, as the
    task's reads join them, not one per event."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked_head() + frame(CHUNKS[0]))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"".join(frame(part) for part in CHUNKS[1:]) + b"0\r\n\r\n")  # all the rest in one write
        await writer.drain()

    async with raw_server(handler) as (url, _):
        p = pool(url)
        r = await p.request("POST", "/v1/chat/completions", [], b"{}")
        first = await anext(r.stream())
        got: list[bytes] = []
        await r.pump(lambda chunk: got.append(chunk) is None)
        assert [chunk async for chunk in r.stream()] == []
        await r.aclose()
        await p.aclose()
    assert first + b"".join(got) == b"".join(CHUNKS)
    assert len(got) <= 2  # one read (two if the kernel split the write)
