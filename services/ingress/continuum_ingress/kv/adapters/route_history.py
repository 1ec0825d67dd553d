"""The JetStream stream that keeps what the ingress replicas share, and its replay when an
ingress process starts (docs/kv-scorer.md, "After a restart").

Replicas publish their routing decisions and remembered `/tokenize` answers on core NATS
(kv/adapters/decisions.py); the stream CONTINUUM_KV_ROUTES captures the same subjects, so the
publishing side does not change and a replica of an older version is not affected. Without the
stream a restarted ingress starts with empty route memories: its approximate records, the
recent demand its cost model balances by, and the tokenizations it would otherwise ask the
engines for again on the requests' path.

A starting process subscribes to the live subjects first, then reads the stream up to the last
sequence it had once that subscription was in place, with an ephemeral consumer that acks
nothing; what came after arrives live. A message stored in the moment between the two comes
both ways; the caller applies it once (kv/replay_overlap.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import nats.errors
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext

from continuum_common.bus import ensure_stream
from continuum_common.config.kv_index import RouteHistory
from continuum_common.wire.decisions import HISTORY_STREAM, HISTORY_SUBJECTS

BATCH = 256  # messages per fetch
YIELD_EVERY = 16  # messages applied between two turns of the event loop (a few milliseconds at most)
FETCH_WAIT_S = 2.0  # the stream had these messages a moment ago: they come at once or not at all
CONSUMER_IDLE_S = 60.0  # the server removes a replay consumer whose process went away


def history_stream_config(settings: RouteHistory, replicas: int) -> StreamConfig:
    return StreamConfig(
        name=HISTORY_STREAM,
        subjects=list(HISTORY_SUBJECTS),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=settings.max_age,
        max_bytes=settings.max_bytes,
        discard=DiscardPolicy.OLD,
        num_replicas=replicas,
    )


async def ensure_history_stream(js: JetStreamContext, settings: RouteHistory, replicas: int) -> bool:
    """Create the stream when it does not exist (True when created; continuum_common.bus)."""
    return await ensure_stream(js, history_stream_config(settings, replicas))


async def replay_history(
    js: JetStreamContext, handle: Callable[[str, bytes], None], *, timeout_s: float, batch: int = BATCH
) -> int:
    """Hand every message the stream holds now to `handle(subject, payload)`, oldest first;
    the number handed. Raises TimeoutError past `timeout_s`, and NATS errors."""
    async with asyncio.timeout(timeout_s):
        state = (await js.stream_info(HISTORY_STREAM)).state
        if not state.messages:
            return 0
        consumer = await js.add_consumer(
            HISTORY_STREAM,
            ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                deliver_policy=DeliverPolicy.ALL,
                inactive_threshold=CONSUMER_IDLE_S,
                mem_storage=True,
            ),
        )
        name = consumer.name
        assert name is not None  # the server names an ephemeral consumer
        sub = await js.pull_subscribe_bind(consumer=name, stream=HISTORY_STREAM)
        try:
            return await _read(sub, state.last_seq, handle, batch)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await js.delete_consumer(HISTORY_STREAM, name)


async def _read(
    sub: JetStreamContext.PullSubscription, last: int, handle: Callable[[str, bytes], None], batch: int
) -> int:
    handed = 0
    while True:
        try:
            msgs = await sub.fetch(batch, timeout=FETCH_WAIT_S)
        except nats.errors.TimeoutError:
            return handed  # expired or purged under us: nothing more to read
        for msg in msgs:
            meta = msg.metadata
            if meta.sequence.stream > last:  # arrived live
                return handed
            handle(msg.subject, msg.data)
            handed += 1
            if handed % YIELD_EVERY == 0:  # requests go on being served during the replay
                await asyncio.sleep(0)
            if meta.sequence.stream == last or meta.num_pending == 0:
                return handed
