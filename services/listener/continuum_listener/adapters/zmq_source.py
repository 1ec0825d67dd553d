"""vLLM / SGLang KV events over ZMQ: a SUB socket per source, replay through a DEALER.

Continuity (kv-events-spec §5.1): the 8-byte seq of every message is checked against the last
one applied.

* the next seq → apply;
* a jump (the engine's PUB dropped batches at its high-water mark) → ask the publisher's ROUTER
  (`replay_endpoint`) for everything it buffers from the first missing seq on, and apply it in
  order: one replay catches up a whole backlog of drops, and the live copies of batches it
  applied, still queued in the SUB, are then skipped as duplicates. A replay that starts after
  the first missing seq (the publisher's buffer no longer holds it), times out before the live
  batch, or is not configured cannot restore the state: the source starts a new epoch and the
  loss is counted;
* the first message after start-up with seq > 0 → replay from seq 0 to rebuild the state the
  engine already holds (as much as its buffer still has); no message in the first half second
  (a quiet engine) → the same replay then;
* seq going backwards (outside a replayed range) → the publisher restarted: new epoch, then the
  same start-up replay.

ZMQ carries no incarnation id, and a restarted engine's seq may pass ours before the listener
sees one of its batches (or its next batch may carry exactly the seq expected). So every replay
that follows an applied batch starts at that batch and compares it with what was applied (its
fingerprint); other bytes, or a buffer that ends before a seq already seen, mean the engine
restarted: new epoch, then the start-up replay. The SUB reconnecting (an engine back at the same
address) triggers such a check at once, before the engine publishes anything.

A gap is only visible when a later batch arrives, so batches the PUB dropped at the end of a
burst would go unnoticed while the engine is quiet. After a gap or a backpressure pause the
source therefore checks the tail once its SUB queue has been empty for `quiet` seconds (50 ms):
the same open-ended replay from the next expected seq (no answer proves no loss; a buffer that
no longer starts there is an unrecoverable gap).

Flow: the SUB socket's FD stays registered with the event loop (`Readiness`); queued messages
are read without blocking for at most `budget` seconds (1 ms) at a time, then the loop yields,
so the HTTP server and the publisher are served during a backlog. Before
reading, the source awaits the publisher's room (backpressure): while the publish queue is full
it reads nothing, the SUB queue and then the engine's PUB fill up, and what the PUB drops comes
back through the replay above. A replay pauses and yields the same way; its DEALER's receive
queue is unbounded (the engine's buffer bounds a replay), so replies wait there rather than
being dropped by the engine's ROUTER. A resync of a block stream (`pipeline.replay_wanted`)
replays the engine's buffer from seq 0 into the new epoch, as at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from continuum_common.config.listener import ListenerSource
from continuum_listener.errors import DecodeError
from continuum_listener.pipeline import SourcePipeline
from continuum_listener.policy.sequence import SeqAction, SeqTracker
from continuum_listener.protocol.frames import parse_pub, parse_replay, replay_request

log = logging.getLogger("continuum.listener.zmq")

ZAP_DOMAIN_PREFIX = "continuum-"
# A peer counts once its handshake (including the ZAP check in bind mode) succeeded.
_CONNECT_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED,)
_DISCONNECT_EVENTS = (zmq.EVENT_DISCONNECTED,)


class Readiness:
    """Whether a plain ZMQ socket has a message queued, awaited on the event loop.

    Why not pyzmq's asyncio sockets: each of their waits costs a Future, a timer, registering and
    unregistering the socket's FD and several `zmq_poll` calls. Here the FD stays registered for
    the socket's life: with paced small batches the listener's loop made a fifth fewer system
    calls and used about a tenth less CPU per batch (docs/benchmarks.md, "Paced small batches").

    ZMQ's FD is edge-triggered: it signals that the socket's state may have changed, and only
    reading `ZMQ_EVENTS` re-arms it. So the reader callback reads `EVENTS` itself (a socket
    left unread during backpressure does not keep the loop spinning) and wakes the waiter only
    when a message is queued; `wait` reads `EVENTS` before it sleeps, which also catches a
    message whose signal came before the wait."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self._sock = sock
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        self._ready = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._signal)

    def _queued(self) -> bool:
        return bool(cast(int, self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def _signal(self) -> None:
        if self._queued():
            self._ready.set()

    async def wait(self, seconds: float) -> bool:
        """True once a message is queued; False after `seconds` without one."""
        if self._queued():
            return True
        self._ready.clear()
        try:
            async with asyncio.timeout(seconds):
                await self._ready.wait()
        except TimeoutError:
            return self._queued()
        return True

    def wake(self) -> None:
        """End a wait early (the source has something else to do)."""
        self._ready.set()

    def close(self) -> None:
        self._loop.remove_reader(self._fd)


def _close(sub: zmq.Socket[bytes], monitor: zmq.asyncio.Socket) -> None:
    with contextlib.suppress(zmq.ZMQError):
        sub.disable_monitor()
    monitor.close(linger=0)
    sub.close(linger=0)


class ZmqSource:
    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        source: ListenerSource,
        pipeline: SourcePipeline,
        *,
        rcvhwm: int | None = None,
        max_replay_seconds: float = 30.0,
        budget: float = 0.001,
        quiet: float = 0.05,
    ) -> None:
        self.ctx = ctx
        self.source = source
        self.pipeline = pipeline
        self.metrics = pipeline.metrics
        self.backend = source.backend_name
        self.rcvhwm = rcvhwm if rcvhwm is not None else source.zmq_rcvhwm
        self.replay_timeout = source.request_timeout_ms / 1000
        self._quiet_replayed = False  # the start-up replay of a quiet engine was done
        self.max_replay_seconds = max_replay_seconds
        self.budget = budget
        self.quiet = quiet
        self.seq = SeqTracker()
        # (seq, fingerprint) of the last batch applied: a replay that reaches that seq again tells
        # whether the engine behind the address is still the one that published it.
        self._applied: tuple[int, int] | None = None
        self.verify_wanted = False  # the SUB reconnected: check the engine's incarnation
        self._connects = 0
        self._ready: Readiness | None = None
        self.suspect = False  # the engine's PUB may have dropped batches we have not seen a gap for

    def _open(self) -> tuple[zmq.Socket[bytes], zmq.asyncio.Socket]:
        """The SUB socket (a plain one: it is awaited through `Readiness`, not pyzmq's asyncio
        layer) and its monitor (attached before connecting, so no event is missed)."""
        sub: zmq.Socket[bytes] = zmq.Socket(self.ctx, zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.rcvhwm)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        # Made by the asyncio context, so the monitor socket is an asyncio one.
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        assert isinstance(monitor, zmq.asyncio.Socket)
        endpoint = self.source.zmq_endpoint
        assert endpoint is not None
        try:
            if self.source.zmq_mode == "bind":
                # The ZAP handler (adapters.zap) checks the peer address against allowed_publishers.
                sub.setsockopt(zmq.ZAP_DOMAIN, (ZAP_DOMAIN_PREFIX + self.backend).encode())
                sub.bind(endpoint)
            else:
                sub.connect(endpoint)
        except zmq.ZMQError:
            # An open socket would keep the context from terminating: the process would hang
            # instead of reporting the taken endpoint.
            _close(sub, monitor)
            raise
        return sub, monitor

    async def run(self) -> None:
        sub, monitor = self._open()
        watcher = asyncio.create_task(self._watch(monitor))
        ready = self._ready = Readiness(sub)
        try:
            while True:
                await self._read(sub, ready)
        finally:
            ready.close()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            _close(sub, monitor)
            self._set_connected(False)

    async def _read(self, sub: zmq.Socket[bytes], ready: Readiness) -> None:
        """Apply queued messages for up to `budget` seconds; wait for one when none is queued."""
        pipeline = self.pipeline
        if self._blocked():
            self.suspect = True  # while we do not read, the engine's PUB may drop
        await pipeline.wait_room()
        if self.verify_wanted:
            self.verify_wanted = False
            await self._check_tail()
        if pipeline.replay_wanted:
            await self._restate()
        deadline = time.monotonic() + self.budget
        while True:
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                if self.verify_wanted:
                    return
                if not self.suspect:
                    # wakes now and then for a resync
                    if not await ready.wait(0.5) and self.seq.last is None and not self._quiet_replayed:
                        await self._startup_replay()
                elif not await ready.wait(self.quiet):
                    await self._check_tail()
                return
            await self.handle(frames)
            if time.monotonic() >= deadline or self._blocked():
                await asyncio.sleep(0)
                return

    def _blocked(self) -> bool:
        flow = self.pipeline.flow
        return flow is not None and flow.blocked

    async def _pause(self) -> float:
        """Yield to the loop, and wait for room to publish; returns the seconds it took (a
        replay does not count them against its deadline)."""
        started = time.monotonic()
        await asyncio.sleep(0)
        await self.pipeline.wait_room()
        return time.monotonic() - started

    async def _startup_replay(self) -> None:
        """Nothing arrived in the first half second after start-up: rebuild what the engine
        already holds from its replay buffer now. A quiet engine may publish nothing for a
        long time, and the new epoch this listener started has cleared the index of it (with
        traffic, the first live batch triggers the same replay). Live copies of replayed
        batches, queued in the SUB meanwhile, are then skipped as duplicates."""
        self._quiet_replayed = True
        await self._rebuild()

    async def _rebuild(self) -> None:
        """Replay everything the engine buffers into the current (new) epoch; the live copies of
        those batches, still queued in the SUB, are then duplicates."""
        if self.source.replay_endpoint is None:
            return
        await self._replay(0, None, fresh=True)
        last = self.seq.last
        if last is not None:
            self.seq.replayed(0, last)

    async def _restarted(self) -> None:
        """A replay showed that the engine is not the incarnation whose batches were applied."""
        log.warning("source %s: the engine's replay buffer does not hold what was applied: restart", self.backend)
        self.pipeline.start_epoch("publisher_restart")
        self._forget()
        await self._rebuild()

    def _forget(self) -> None:
        self.seq.forget()
        self._applied = None

    def _apply(self, seq: int, payload: bytes) -> None:
        self.seq.advance(seq)
        self._applied = (seq, hash(payload))
        self.pipeline.apply_payload(payload)

    async def _check_tail(self) -> None:
        self.suspect = False
        if self.seq.last is not None and self.source.replay_endpoint is not None:
            await self._catch_up(self.seq.last + 1, None)

    async def _catch_up(self, start: int, live: int | None) -> bool:
        """Replay everything the engine buffers from `start` on (one request catches up a whole
        backlog of drops, rather than one per gap). `live` is the seq of the live batch that
        showed the gap: when the replay did not reach the batch before it, what is missing is
        counted and a new epoch starts. True when the replay covered `live` itself, and when it
        showed an engine restart (the new incarnation's buffer was then replayed).

        No answer to a tail check (`live` None) proves no loss; a buffer that starts after
        `start` does, and the replay starts a new epoch itself."""
        if await self._replay(start, None, fresh=False) == "restarted":
            return True
        last = self.seq.last
        if last is not None and last >= start:
            self.seq.replayed(start, last)  # live copies still queued in the SUB are duplicates
        if live is None:
            return False
        reached = -1 if last is None else last
        if reached >= live:
            return True
        if reached < live - 1:
            self.pipeline.drop("replay_lost", live - 1 - reached)
            self.pipeline.start_epoch("gap")
        return False

    async def _restate(self) -> None:
        """Resync of the block stream: replay what the engine still buffers into the new epoch."""
        self.pipeline.replay_wanted = False
        last = self.seq.last
        if last is not None and self.source.replay_endpoint is not None:
            await self._replay(0, last + 1, fresh=True)

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        peers = 0
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())["event"]
            if event in _CONNECT_EVENTS:
                self._connects += 1
                if self._connects > 1:
                    # A reconnect: the engine may have restarted behind the same address.
                    self.verify_wanted = True
                    if self._ready is not None:
                        self._ready.wake()
                peers += 1
                self.pipeline.stats.reconnects += 1
                self.metrics.reconnects.labels(self.backend).inc()
            elif event in _DISCONNECT_EVENTS:
                peers = max(0, peers - 1)
            self._set_connected(peers > 0)

    def _set_connected(self, connected: bool) -> None:
        self.pipeline.stats.connected = connected
        self.metrics.connected.labels(self.backend).set(1 if connected else 0)

    async def handle(self, frames: list[bytes]) -> None:
        """One live PUB message."""
        try:
            frame = parse_pub(frames)
        except DecodeError as exc:
            self.pipeline.drop(exc.reason)
            return
        decision = self.seq.observe(frame.seq)
        if decision.action is SeqAction.DUPLICATE:
            return
        if decision.action is SeqAction.RESTART:
            log.warning("source %s: publisher seq went back to %d: restart", self.backend, frame.seq)
            self.pipeline.start_epoch("publisher_restart")
            self._forget()
        if decision.action is SeqAction.GAP:
            self.suspect = True  # the PUB is dropping: more may be missing after the last one seen
            if await self._catch_up(decision.missing_from, frame.seq):
                return  # the replay reached past this batch: it is applied already
        elif (  # JOIN, or RESTART past seq 0
            decision.action is not SeqAction.APPLY
            and frame.seq > 0
            and await self._replay(0, frame.seq, fresh=True) == "restarted"
        ):
            return  # this batch's engine is gone; its successor's buffer was replayed
        self._apply(frame.seq, frame.payload)

    async def _replay(self, start: int, end: int | None, *, fresh: bool) -> str:
        """Apply batches [start, end) from the replay socket (`end` None: everything the engine
        has from `start` on). Returns the outcome: recovered, partial, timeout, failed, or
        restarted (the engine is a new incarnation: a new epoch holds its buffer then).

        The request starts at the last batch applied, when there is one before `end`: its copy
        in the engine's buffer is compared with it, and a copy with other bytes, or a buffer
        that ends before it or before `end` (seqs this listener has seen), shows a restart.

        `fresh`: nothing is tracked yet (start-up or restart), so a partial history is still
        useful and never forces a new epoch."""
        endpoint = self.source.replay_endpoint
        if endpoint is None:
            if not fresh:
                self.metrics.replay(self.backend, "failed")
                if end is not None:
                    self.pipeline.drop("replay_lost", end - start)
            return "recovered" if fresh else "failed"
        check = self._applied
        if check is not None and end is not None and check[0] >= end:
            check = None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        # Unbounded: the replay is bounded by the engine's buffer, and replies must wait here
        # (not be dropped by the engine's ROUTER) while backpressure pauses the reading.
        dealer.setsockopt(zmq.RCVHWM, 0)
        try:
            dealer.connect(endpoint)
            await dealer.send_multipart(replay_request(start if check is None else min(start, check[0])))
            expected, outcome, fresh = await self._apply_replies(dealer, start, end, fresh, check)
        finally:
            dealer.close(linger=0)
        if outcome == "restarted":
            self.metrics.replay(self.backend, outcome)
            await self._restarted()
            return outcome
        if end is not None and expected < end:
            self.pipeline.drop("replay_lost", end - expected)
            if outcome == "recovered":
                outcome = "failed"
        self.metrics.replay(self.backend, outcome)
        return outcome

    async def _apply_replies(
        self, dealer: zmq.asyncio.Socket, start: int, end: int | None, fresh: bool, check: tuple[int, int] | None
    ) -> tuple[int, str, bool]:
        """Read replies until `end` or the end marker; returns (next expected seq, outcome,
        fresh). `check`: the (seq, fingerprint) of the last batch applied, to compare."""
        expected, outcome = start, "recovered"
        deadline = time.monotonic() + self.max_replay_seconds
        yield_at = time.monotonic() + self.budget
        while end is None or expected < end:
            if time.monotonic() >= yield_at or self._blocked():
                deadline += await self._pause()
                yield_at = time.monotonic() + self.budget
            wait = min(self.replay_timeout, deadline - time.monotonic())
            if wait <= 0 or not await dealer.poll(int(wait * 1000)):
                outcome = "timeout"
                break
            try:
                item = parse_replay(await dealer.recv_multipart())
            except DecodeError as exc:
                self.pipeline.drop(exc.reason)
                continue
            if item is None:
                # The engine's newest batch is older than one already seen here: it restarted.
                if check is not None or (end is not None and expected < end):
                    outcome = "restarted"
                break
            if check is not None and item.seq >= check[0]:
                if item.seq == check[0] and hash(item.payload) != check[1]:
                    return expected, "restarted", fresh
                check = None  # the same engine (or its buffer no longer holds the batch: the gap rules judge)
            if item.seq < expected:
                continue
            if item.seq > expected:
                # The publisher's buffer starts after what we asked for.
                self.pipeline.drop("replay_lost", (item.seq if end is None else min(item.seq, end)) - expected)
                if not fresh:
                    self.pipeline.start_epoch("replay_lost")
                    fresh = True  # from here on we rebuild as after a restart
                outcome = "partial"
                expected = item.seq
                if end is not None and expected >= end:
                    break
            self._apply(item.seq, item.payload)
            expected = item.seq + 1
        return expected, outcome, fresh
