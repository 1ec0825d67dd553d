"""TensorRT-LLM: poll `POST <trtllm_endpoint>` (trtllm-serve's /kv_cache_events drain).

The drain hands each event to exactly one caller, so a source has exactly one poller. The server
waits up to 2 s for events before answering `[]`, so the read timeout is the source's
`request_timeout_ms` plus that wait. Redirects are refused (counted): the configuration names the
one host allowed to announce this backend's cache, and a redirect could point anywhere.

event_id continuity per attention-DP rank (policy.sequence.EventIdTracker): duplicates are
skipped, a gap or a restart withdraws that rank's blocks (its other ranks stay announced).

One response body is one engine batch: its events become one block batch. Before each poll the
source awaits the publisher's room (backpressure): the engine's queue holds what is not drained.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from continuum_common.backoff import Backoff
from continuum_common.config.listener import ListenerSource
from continuum_listener.errors import DecodeError
from continuum_listener.pipeline import MAX_RANKS, SourcePipeline
from continuum_listener.policy.sequence import EventIdTracker, IdAction
from continuum_listener.protocol.trtllm import decode_body

MAX_COUNTED_GAP = 1_000_000  # events counted as lost for one id gap at most
log = logging.getLogger("continuum.listener.trtllm")
SERVER_WAIT_S = 2.0
MAX_BODY = 64 << 20


class PollError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TrtllmSource:
    def __init__(self, source: ListenerSource, pipeline: SourcePipeline, *, max_body: int = MAX_BODY) -> None:
        assert source.trtllm_endpoint is not None
        self.source = source
        self.url = source.trtllm_endpoint
        self.pipeline = pipeline
        self.metrics = pipeline.metrics
        self.backend = source.backend_name
        self.max_body = max_body
        self.ids = EventIdTracker()
        self.max_window: int | None = None
        timeout = source.request_timeout_ms / 1000
        self.timeout = httpx.Timeout(timeout + SERVER_WAIT_S, connect=timeout)

    async def run(self) -> None:
        backoff = Backoff(0.25, 30.0)
        async with httpx.AsyncClient(follow_redirects=False, timeout=self.timeout, trust_env=False) as client:
            while True:
                await self.pipeline.wait_room()
                try:
                    body = await self._poll(client)
                except (httpx.HTTPError, PollError) as exc:
                    reason = exc.reason if isinstance(exc, PollError) else type(exc).__name__
                    if self.pipeline.stats.connected:
                        log.warning("source %s: poll failed (%s)", self.backend, reason)
                    if isinstance(exc, PollError):
                        self.pipeline.drop(exc.reason)
                    self._set_connected(False)
                    await asyncio.sleep(backoff.next())
                    continue
                backoff.reset()
                self._set_connected(True)
                try:
                    handled = self.handle(body)
                except Exception:  # a bug must not stop the poller: count, log (no body), go on
                    self.pipeline.drop("other")
                    log.exception("source %s: failed to apply a response of %d bytes", self.backend, len(body))
                    handled = 0
                if not handled:
                    await asyncio.sleep(self.source.poll_interval_ms / 1000)

    def _set_connected(self, connected: bool) -> None:
        if connected and not self.pipeline.stats.connected:
            self.pipeline.stats.reconnects += 1
            self.metrics.reconnects.labels(self.backend).inc()
        self.pipeline.stats.connected = connected
        self.metrics.connected.labels(self.backend).set(1 if connected else 0)

    async def _poll(self, client: httpx.AsyncClient) -> bytes:
        async with client.stream("POST", self.url) as response:
            if response.status_code != 200:
                raise PollError("http")
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self.max_body:
                    raise PollError("too_large")
                chunks.append(chunk)
        return b"".join(chunks)

    def handle(self, body: bytes) -> int:
        """Apply one response body; returns how many events it held."""
        try:
            decoded = decode_body(body, keep_tokens=self.pipeline.blocks is not None)
        except DecodeError as exc:
            self.pipeline.drop(exc.reason)
            return 0
        for reason, n in decoded.skipped.items():
            self.pipeline.drop(reason, n)
        if decoded.events:
            self.metrics.batches.labels(self.backend).inc()
        for event in decoded.events:
            if event.rank >= MAX_RANKS:
                self.pipeline.drop("schema")
                continue
            last = self.ids.last.get(event.rank)
            action = self.ids.observe(event.rank, event.event_id, event.created)
            if action is IdAction.DUPLICATE:
                self.pipeline.drop("duplicate")
                continue
            if action is IdAction.GAP and last is not None:
                # An id that jumps by 2^53 is a broken publisher, not 2^53 lost events: the
                # count is capped so one bad id cannot swamp the metric.
                self.pipeline.drop("replay_lost", min(event.event_id - last - 1, MAX_COUNTED_GAP))
            if action in (IdAction.GAP, IdAction.RESET):
                log.info("source %s rank %d: %s at event %d", self.backend, event.rank, action.value, event.event_id)
                self.pipeline.reset_rank(event.rank)
            if event.reason is not None:
                self.pipeline.drop(event.reason)
                continue
            if event.window is not None:
                if self.max_window is None or event.window > self.max_window:
                    self.max_window = event.window
                elif event.window < self.max_window:
                    self.pipeline.drop("window")
                    continue
            self.pipeline.apply_rank(event.rank, event.events)
        self.pipeline.end_batch()
        return len(decoded.events)
