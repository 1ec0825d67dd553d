"""Resync requests to listeners over core NATS (continuum_common.wire.resync)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from nats.aio.client import Client as NatsClient

from continuum_common.wire.resync import ResyncRequest, ResyncThrottle, encode_resync_request, subject_for
from continuum_indexer.metrics import IndexerMetrics

log = logging.getLogger("continuum.indexer")

PUBLISH_TIMEOUT_S = 2.0


class ResyncRequester:
    def __init__(
        self, nc: NatsClient, metrics: IndexerMetrics, *, requester: str, throttle: ResyncThrottle | None = None
    ) -> None:
        self.nc = nc
        self.metrics = metrics
        self.requester = requester
        self.throttle = throttle or ResyncThrottle()

    async def request(self, backends: Iterable[str]) -> None:
        """Ask the listeners of `backends` to restate them (throttled per backend). Never
        raises: a request that cannot be sent is counted and asked again after the interval."""
        ask, wait = self.throttle.due(backends)
        m = self.metrics
        for backend in wait:
            m.block_resyncs.labels(m.backend(backend), "throttled").inc()
        for backend in ask:
            payload = encode_resync_request(ResyncRequest(backend, "index_gap", self.requester))
            try:
                async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                    await self.nc.publish(subject_for(backend), payload)
            except Exception as exc:  # the bus is down: the next gap after the interval asks again
                m.block_resyncs.labels(m.backend(backend), "failed").inc()
                log.warning("resync request for %s not sent: %s", backend, type(exc).__name__)
                continue
            m.block_resyncs.labels(m.backend(backend), "sent").inc()
            log.warning("the block index lacks the history of %s: asked its listener to restate it", backend)
