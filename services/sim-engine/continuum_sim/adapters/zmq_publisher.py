"""The KV-event publisher: ZMQ PUB + ROUTER replay, as vLLM's `ZmqEventPublisher` (spec §1.1-1.2).

* PUB: one 3-frame message `[topic, u64be seq, payload]` per batch; seq counts batches from 0.
  The socket binds (default) or connects (`zmq_mode="connect"`, for a listener that binds).
  At the high-water mark PUB drops silently, exactly as in vLLM; the seq gap is the signal.
* ROUTER replay (always bound): a request is `[identity, b"", u64be start_seq]`; every buffered
  batch with seq >= start_seq is sent back, then the end marker. Reply shape per era: map →
  `[topic, seq, payload]` / `[b"", ff*8, b""]` (vLLM ≥ 2026-07-07); array/sglang → `[seq, payload]`
  / `[ff*8, b""]`. Malformed requests are counted and ignored.
* The buffer keeps the last `buffer_steps` batches and at most `replay_buffer_bytes` bytes.

Single event loop, no threads: sends are non-blocking (PUB never blocks), the replay server is
one task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from continuum_sim.config import KvEventsConfig
from continuum_sim.metrics import EngineMetrics
from continuum_sim.protocol.kv_wire import BatchEncoder, KvEvent, pub_frames, replay_end_frames, replay_reply_frames

log = logging.getLogger(__name__)


class ZmqEventPublisher:
    def __init__(
        self,
        config: KvEventsConfig,
        metrics: EngineMetrics,
        context: zmq.asyncio.Context,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._metrics = metrics
        self._ctx = context
        self._clock = clock
        self._encoder = BatchEncoder(config.era, config.hash_wire, config.data_parallel_rank)
        self._topic = config.topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque()
        self._buffer_bytes = 0
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.endpoint: str | None = None
        self.replay_endpoint: str | None = None

    @property
    def next_seq(self) -> int:
        return self._seq

    async def start(self) -> None:
        # PUB sends never block, so a plain (sync) socket on the same context is enough and
        # raises zmq.Again synchronously instead of parking it in a future.
        pub: zmq.Socket[bytes] = zmq.Context.shadow(self._ctx.underlying).socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.set_hwm(self.config.hwm)
        self._pub = pub  # owned from here on, so close() releases it even if binding fails
        if self.config.zmq_mode == "bind":
            pub.bind(_wildcard_port(self.config.endpoint))
            self.endpoint = _connectable(pub.getsockopt_string(zmq.LAST_ENDPOINT))
        else:
            pub.connect(self.config.endpoint)
            self.endpoint = self.config.endpoint
        if self.config.replay_endpoint:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            self._router = router
            router.bind(_wildcard_port(self.config.replay_endpoint))
            self.replay_endpoint = _connectable(router.getsockopt_string(zmq.LAST_ENDPOINT))
            self._replay_task = asyncio.create_task(self._serve_replay(router), name="kv-replay")

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None

    def publish(self, events: Sequence[KvEvent]) -> None:
        """Encode one step's events as a batch and send it (never blocks)."""
        if not events or self._pub is None:
            return
        payload = self._encoder.encode(self._clock(), events)
        seq = self._seq
        self._seq += 1
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart(pub_frames(self._topic, seq, payload), flags=zmq.NOBLOCK)
        self._metrics.events_published.inc()
        self._remember(seq, payload)

    def forget(self) -> None:
        """Drop the replay buffer: a replay then answers only what is published from now on
        (sequence numbers go on, so a live subscriber sees no gap)."""
        self._buffer.clear()
        self._buffer_bytes = 0

    def _remember(self, seq: int, payload: bytes) -> None:
        if self._router is None:
            return
        self._buffer.append((seq, payload))
        self._buffer_bytes += len(payload)
        while len(self._buffer) > self.config.buffer_steps or (
            self._buffer_bytes > self.config.replay_buffer_bytes and len(self._buffer) > 1
        ):
            _, old = self._buffer.popleft()
            self._buffer_bytes -= len(old)
            self._metrics.replay_evicted.inc()

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:  # vLLM's only check; any start_seq length is accepted
                self._metrics.replay_requests.labels("malformed").inc()
                log.warning("ignoring malformed replay request (%d frames)", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            self._metrics.replay_requests.labels("ok").inc()
            # Snapshot first: the buffer may change while we await the sends.
            for seq, payload in [item for item in self._buffer if item[0] >= start]:
                await router.send_multipart(
                    [identity, b"", *replay_reply_frames(self.config.era, self._topic, seq, payload)]
                )
            await router.send_multipart([identity, b"", *replay_end_frames(self.config.era)])


def _wildcard_port(endpoint: str) -> str:
    """ZMQ spells "any free port" `*`; accept the more familiar `:0` too."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


def _connectable(endpoint: str) -> str:
    """A bound endpoint as a peer should dial it (`tcp://0.0.0.0:p` → `tcp://127.0.0.1:p`)."""
    return endpoint.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:").replace("tcp://*:", "tcp://127.0.0.1:")
