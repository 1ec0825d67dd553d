"""A long-poll pull loop over a nats-py pull subscription.

nats-py's `PullSubscription.fetch()` awaits each message of a batch with its own `wait_for`
(tens of µs per message) and either returns small batches or waits out its timeout. This keeps
exactly one pull request outstanding on the server (`batch` messages, `expires` long), drains
whatever has been delivered without waiting per message, and sends the next request as soon
as the previous one is used up, so the server streams the next batch while this one is being
applied. An event published into an idle stream is delivered at once to the waiting request.

It reads the subscription's delivery queue and pull subject (nats-py private attributes, stable
since 2.x); everything else goes through nats-py's public API.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, cast

import orjson
from nats.aio.msg import Msg
from nats.js.errors import APIError

_STATUS = "Status"
_DESCRIPTION = "Description"
# 404 no messages, 408 request expired, 409 limits / leadership change: the request is over
_REQUEST_DONE = frozenset({"404", "408", "409"})
_HEARTBEAT = "100"
# A request that ends without data sooner than this is not re-sent at once (a deleted
# consumer or a misbehaving server must not turn the loop into a busy spin).
_MIN_REQUEST_INTERVAL_S = 0.05


class ConsumerGoneError(APIError):
    """The consumer was deleted (or is no longer a pull consumer): subscribe again."""


class PullStream:
    def __init__(self, psub: Any, *, batch: int, expires_s: float = 5.0) -> None:
        self._sub = psub._sub
        self._nc = psub._nc
        self._subject: str = psub._nms
        self._inbox: str = psub._deliver
        self._queue: asyncio.Queue[Msg] = psub._sub._pending_queue
        self.batch = batch
        self.expires_s = expires_s
        self._outstanding = 0
        self._request_deadline = 0.0
        self._requested_at = 0.0
        self._ended_early = False
        # Put into the delivery queue by wake(): a waiting next_batch returns at once. Never
        # delivered by the server (a message of no subscription), never handed to callers.
        self._wake_msg = Msg(_client=cast(Any, None), subject="")

    def wake(self) -> None:
        """Make a next_batch that is waiting for the first message return now (with what it has,
        possibly nothing): a consumer told to stop need not wait out `max_wait_s`."""
        with contextlib.suppress(asyncio.QueueFull):  # full: nothing is waiting
            self._queue.put_nowait(self._wake_msg)

    async def next_batch(self, max_wait_s: float) -> list[Msg]:
        """Up to `batch` delivered messages; waits up to `max_wait_s` when none is there yet
        (then returns []). Raises APIError when the server refuses the pull (consumer gone)."""
        msgs = self._drain()
        if not msgs:
            await self._ensure_request()
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            # that lands as the queue hands over a message, and the consumer then never stops.
            try:
                async with asyncio.timeout(max_wait_s):
                    first = await self._queue.get()
            except TimeoutError:
                return []
            self._took(first)
            if first is self._wake_msg:
                return []
            if self._is_data(first):
                msgs.append(first)
            msgs += self._drain()
        await self._ensure_request()
        return msgs

    def leftovers(self) -> list[Msg]:
        """Messages delivered but not yet taken (at shutdown: nak them so another replica gets
        them now rather than after ack_wait)."""
        left: list[Msg] = []
        while not self._queue.empty():
            msg = self._queue.get_nowait()
            self._took(msg)
            if msg is not self._wake_msg and not (msg.headers and msg.headers.get(_STATUS)):
                left.append(msg)
        return left

    def _drain(self) -> list[Msg]:
        msgs: list[Msg] = []
        queue = self._queue
        while len(msgs) < self.batch and not queue.empty():
            msg = queue.get_nowait()
            self._took(msg)
            if msg is not self._wake_msg and self._is_data(msg):
                msgs.append(msg)
        return msgs

    def _took(self, msg: Msg) -> None:
        self._sub._pending_size -= len(msg.data)
        self._queue.task_done()

    def _is_data(self, msg: Msg) -> bool:
        status = msg.headers.get(_STATUS) if msg.headers else None
        if status is None:
            self._outstanding -= 1
            return True
        if status == _HEARTBEAT:
            return False
        description = (msg.headers.get(_DESCRIPTION, "") if msg.headers else "").lower()
        if status == "409" and ("deleted" in description or "push based" in description):
            raise ConsumerGoneError(code=409, description=description)
        if status not in _REQUEST_DONE:  # e.g. 503: nobody serves the consumer any more
            raise ConsumerGoneError(code=int(status) if status.isdigit() else None, description=description)
        self._outstanding = 0
        self._ended_early = status != "408"
        return False

    async def _ensure_request(self) -> None:
        # A request lost with the connection never reports back: its deadline retires it.
        now = time.monotonic()
        if self._outstanding > 0 and now < self._request_deadline:
            return
        if self._ended_early and now - self._requested_at < _MIN_REQUEST_INTERVAL_S:
            await asyncio.sleep(_MIN_REQUEST_INTERVAL_S - (now - self._requested_at))
        request = {"batch": self.batch, "expires": int(self.expires_s * 1e9)}
        await self._nc.publish(self._subject, orjson.dumps(request), reply=self._inbox)
        self._requested_at = time.monotonic()
        self._ended_early = False
        self._outstanding = self.batch
        self._request_deadline = self._requested_at + self.expires_s + 1.0
