"""The edge's client transport: writes of one event-loop turn leave as one send; closing and EOF
flush first, abort drops."""

from __future__ import annotations

import asyncio
from typing import Any

from continuum_ingress.edge import CoalescingTransport


class Recorder:
    """The real transport's side: what was written, and in how many calls."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def write_eof(self) -> None:
        self.events.append("eof")

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


def _wrapped() -> tuple[CoalescingTransport, Recorder]:
    real = Recorder()
    return CoalescingTransport(real, asyncio.get_running_loop()), real  # type: ignore[arg-type]


async def test_writes_of_one_turn_leave_as_one_send() -> None:
    transport, real = _wrapped()
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(bytearray(b"{}"))
    transport.write(b"")
    assert real.writes == []
    assert transport.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    transport.write(b"next")
    await asyncio.sleep(0)
    assert real.writes[-1] == b"next" and len(real.writes) == 2


async def test_close_and_eof_flush_first_and_abort_drops() -> None:
    transport, real = _wrapped()
    transport.write(b"answer")
    transport.write_eof()
    assert real.writes == [b"answer"] and real.events == ["eof"]
    transport.write(b"last")
    transport.close()
    assert real.writes == [b"answer", b"last"] and real.events == ["eof", "close"]

    transport, real = _wrapped()
    transport.write(b"lost")
    transport.abort()
    await asyncio.sleep(0)
    assert real.writes == [] and real.events == ["abort"]


async def test_nothing_is_written_to_a_closing_transport_and_the_rest_is_delegated() -> None:
    transport, real = _wrapped()
    transport.write(b"late")
    real.closing = True
    await asyncio.sleep(0)
    assert real.writes == []
    assert transport.is_closing()
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)
