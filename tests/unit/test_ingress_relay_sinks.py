"""The sinks that write a stream's chunks from the upstream connection's callbacks
(continuum_ingress/relay.py): what they write, when they refuse, what they leave for the task."""

from __future__ import annotations

import asyncio
import itertools

from continuum_ingress.deadline import Deadline
from continuum_ingress.relay import ChunkSink, FirstChunkSink


class Out:
    def __init__(self, ready: bool = True) -> None:
        self.ready = ready
        self.written: list[bytes] = []

    def relay_ready(self) -> bool:
        return self.ready

    def relay(self, data: bytes) -> None:
        self.written.append(data)


class Upper:
    """A translator that upper-cases, and drops chunks that say 'skip'."""

    def body(self, data: bytes) -> bytes:
        return data.upper()

    def chunk(self, data: bytes) -> bytes:
        return b"" if data == b"skip" else data.upper()

    def end(self) -> bytes:
        return b""


class Recorder:
    def __init__(self) -> None:
        self.fed: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        self.fed.append(chunk)

    async def commit(self, status: int, headers: object) -> object:
        return None

    def abort(self) -> None:
        pass

    def abandon(self, status: int, headers: object) -> None:
        pass


def test_chunk_sink_translates_writes_then_records_and_refuses_while_the_client_is_not_reading() -> None:
    out, recorder = Out(), Recorder()
    sink = ChunkSink(out, Upper(), recorder)
    assert sink(b"a") and sink(b"skip") and sink(b"b")
    assert out.written == [b"A", b"B"] and recorder.fed == [b"A", b"B"]
    out.ready = False
    assert not sink(b"c")  # refused: nothing translated, written or recorded
    assert out.written == [b"A", b"B"] and recorder.fed == [b"A", b"B"]


async def test_first_chunk_sink_writes_at_once_disarms_the_deadline_and_stamps_its_times() -> None:
    task = asyncio.current_task()
    assert task is not None
    ticks = itertools.count(1)
    out = Out()
    with Deadline(task, task.get_loop().time() + 0.02) as deadline:
        sink = FirstChunkSink(out, Upper(), deadline, lambda: float(next(ticks)))
        assert sink(b"hello")
        await asyncio.sleep(0.05)  # the first-byte deadline passes: disarmed, nothing happens
    assert not deadline.expired()
    assert out.written == [b"HELLO"]
    assert (sink.raw, sink.sent, sink.arrived_at, sink.written_at) == (b"hello", b"HELLO", 1.0, 2.0)

    async def rest() -> object:
        yield b"more"

    first = sink.first_chunk(rest(), None)  # type: ignore[arg-type]
    assert first is not None and first.first == b"hello" and first.sent == b"HELLO" and first.written_at == 2.0


async def test_first_chunk_sink_refuses_once_the_deadline_expired_or_while_the_client_is_not_reading() -> None:
    task = asyncio.current_task()
    assert task is not None
    out = Out(ready=False)
    deadline = Deadline(task, None)
    sink = FirstChunkSink(out, None, deadline, lambda: 1.0)
    assert not sink(b"x")  # the client is not reading: the deadline stays armed
    out.ready = True
    try:
        with deadline:
            deadline.expire()  # the forwarder is about to retry on another backend
            assert not sink(b"x")  # so nothing may reach the client
            await asyncio.sleep(1)
    except TimeoutError:
        pass
    assert out.written == [] and sink.raw is None
    assert sink.first_chunk(None, None) is None  # type: ignore[arg-type]
