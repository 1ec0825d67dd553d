"""Per-source stats heartbeat into the JetStream KV bucket `continuum_listeners` (DESIGN.md §5).

Key = backend name; value = JSON `{backend, listener, connected, events_received,
events_dropped, last_event_at, reconnects, block_size_mismatches, source_epoch, ts}`. The bucket
is created with a TTL of several intervals, so the entry of a listener that died disappears, and
with the replica count of the event stream (`bus.stream.replicas`), so it survives the loss of a
NATS node as the stream does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Sequence

import orjson
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from continuum_common.events import LISTENERS_BUCKET
from continuum_listener.adapters.publisher import JetStreamPublisher
from continuum_listener.pipeline import SourcePipeline

log = logging.getLogger("continuum.listener.heartbeat")

# A beat's NATS calls may take longer than a short interval on a loaded machine (creating the
# bucket is a JetStream round trip through the meta leader): never time them out sooner.
MIN_CALL_TIMEOUT = 2.0


def heartbeat_value(pipeline: SourcePipeline, listener: str) -> bytes:
    stats = pipeline.stats
    return orjson.dumps(
        {
            "backend": pipeline.backend,
            "listener": listener,
            "connected": stats.connected,
            "events_received": stats.received,
            "events_dropped": stats.dropped,
            "last_event_at": stats.last_event_at,
            "reconnects": stats.reconnects,
            "block_size_mismatches": stats.mismatches,
            "source_epoch": pipeline.sequencer.epoch,
            "ts": time.time(),
        }
    )


class Heartbeat:
    def __init__(
        self, publisher: JetStreamPublisher, pipelines: Sequence[SourcePipeline], *, interval: float = 5.0
    ) -> None:
        self.publisher = publisher
        self.pipelines = list(pipelines)
        self.interval = interval
        self.listener = f"{socket.gethostname()}:{os.getpid()}"
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        js = self.publisher.js
        assert js is not None
        try:
            return await js.key_value(LISTENERS_BUCKET)
        except BucketNotFoundError:
            config = KeyValueConfig(
                bucket=LISTENERS_BUCKET,
                ttl=self.interval * 6,
                history=1,
                replicas=self.publisher.cfg.stream.replicas,
            )
            return await js.create_key_value(config)

    async def beat(self) -> None:
        timeout = max(self.interval, MIN_CALL_TIMEOUT)
        if self._kv is None:
            self._kv = await asyncio.wait_for(self._bucket(), timeout)
        for pipeline in self.pipelines:
            await asyncio.wait_for(self._kv.put(pipeline.backend, heartbeat_value(pipeline, self.listener)), timeout)

    async def run(self) -> None:
        await self.publisher.ready.wait()
        while True:
            if self.publisher.connected:
                try:
                    await self.beat()
                except Exception as exc:  # NATS errors and timeouts: try again next interval
                    self._kv = None
                    log.warning("heartbeat failed: %s", type(exc).__name__)
            await asyncio.sleep(self.interval)
