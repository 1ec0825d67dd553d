"""The upstream pool's Outbox: requests are written at the end of the loop turn that posted
them, in order, and one connection's closed or failing transport holds back no other."""

from __future__ import annotations

import asyncio
from typing import Any

from continuum_ingress.adapters.h1 import Disconnected, Outbox, _Connection


class _Transport:
    def __init__(self, *, closing: bool = False, fail: bool = False) -> None:
        self.closing = closing
        self.fail = fail
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        if self.fail:
            raise RuntimeError("transport broke")
        self.written.append(data)


def _conn(loop: asyncio.AbstractEventLoop, transport: _Transport) -> _Connection:
    conn = _Connection(loop)
    conn.transport = transport  # type: ignore[assignment]
    return conn


async def test_writes_wait_for_the_end_of_the_turn_and_keep_their_order() -> None:
    loop = asyncio.get_running_loop()
    outbox = Outbox()
    a, b = _Transport(), _Transport()
    ca, cb = _conn(loop, a), _conn(loop, b)
    outbox.post(ca, b"1")
    outbox.post(cb, b"2")
    outbox.post(ca, b"3")
    assert a.written == [] and b.written == []  # nothing before the turn ends
    await asyncio.sleep(0)
    assert a.written == [b"1", b"3"] and b.written == [b"2"]
    outbox.post(cb, b"4")  # a new turn: a new flush is scheduled
    await asyncio.sleep(0)
    assert b.written == [b"2", b"4"]


async def test_a_closed_or_failing_transport_holds_back_no_other() -> None:
    loop = asyncio.get_running_loop()
    outbox = Outbox()
    closed, broken, fine = _Transport(closing=True), _Transport(fail=True), _Transport()
    c_closed, c_broken, c_fine = _conn(loop, closed), _conn(loop, broken), _conn(loop, fine)
    waiter: asyncio.Future[Any] = loop.create_future()
    c_broken._waiter = waiter
    for conn in (c_closed, c_broken, c_fine):
        outbox.post(conn, b"req")
    await asyncio.sleep(0)
    assert closed.written == [] and fine.written == [b"req"]
    assert c_closed.error is None  # its connection_lost reports it, as before
    assert isinstance(c_broken.error, Disconnected) and "transport broke" in str(c_broken.error)
    assert waiter.done()  # the request waiting on it learns at once
