"""Resync requests from KV index consumers (continuum_common.wire.resync): a consumer that
lost a backend's history asks its listener to restate it. One subscription per backend this
listener serves (so NATS permissions can stay per listener), on the publisher's connection
(nats-py subscribes again after a reconnect). An accepted request marks the backend's pipeline
for a resync, which the supervisor runs once the publisher has room; at most one per
`interval` per backend, whatever the number of consumers asking."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from continuum_common.wire.resync import ResyncRequestDecodeError, ResyncThrottle, decode_resync_request, subject_for
from continuum_listener.adapters.publisher import JetStreamPublisher
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import SourcePipeline

log = logging.getLogger(__name__)

RESYNC_INTERVAL_S = 10.0


class ResyncResponder:
    def __init__(
        self,
        publisher: JetStreamPublisher,
        pipelines: Mapping[str, SourcePipeline],
        metrics: ListenerMetrics,
        throttle: ResyncThrottle | None = None,
    ) -> None:
        self.publisher = publisher
        self.pipelines = pipelines
        self.metrics = metrics
        self.throttle = throttle or ResyncThrottle(RESYNC_INTERVAL_S)

    async def run(self) -> None:
        """Subscribe once the publisher is connected; runs until cancelled."""
        await self.publisher.ready.wait()
        nc = self.publisher.nc
        assert nc is not None
        subs: list[Any] = []
        try:
            for backend, pipeline in self.pipelines.items():
                if pipeline.blocks is not None:
                    subs.append(await nc.subscribe(subject_for(backend), cb=self._on_message))
            await asyncio.Event().wait()
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _on_message(self, msg: Any) -> None:
        backend = str(msg.subject).rpartition(".")[2]
        pipeline = self.pipelines.get(backend)
        if pipeline is None:
            return
        try:
            request = decode_resync_request(msg.data)
        except ResyncRequestDecodeError:
            self.metrics.resync_requests.labels(backend, "invalid").inc()
            return
        if request.backend != backend:
            self.metrics.resync_requests.labels(backend, "invalid").inc()
            return
        ask, _ = self.throttle.due([backend])
        if not ask:
            self.metrics.resync_requests.labels(backend, "throttled").inc()
            return
        self.metrics.resync_requests.labels(backend, "accepted").inc()
        log.warning("source %s: a consumer lost its history (%s); restating it", backend, request.reason)
        pipeline.want_resync()
