"""Composition root of `continuum-kv-listener`: builds every part, owns the TaskGroup, and
shuts down in order.

Start: each source begins a fresh `source_epoch` (announced with `cleared`, see
docs/listener.md), then the ZMQ subscribers / TRT-LLM pollers, detokenize workers, flush timers,
the JetStream publisher and heartbeat (when `bus` is configured) and the HTTP server start.

Stop (SIGTERM, SIGINT or `stop()`): sources stop first, pending coalesced changes are flushed,
SSE consumers get `draining`, buffered events are published (bounded wait), then everything else
is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import zmq
import zmq.asyncio

from continuum_common.asgi_server import EmbeddedServer
from continuum_common.config.listener import ListenerSource
from continuum_common.events import KvEvent
from continuum_common.loop_lag import measure_loop_lag
from continuum_common.runner import settle_heap
from continuum_common.tracing import Tracing
from continuum_listener.adapters.detokenize import DetokenizeClient
from continuum_listener.adapters.heartbeat import Heartbeat
from continuum_listener.adapters.http_server import build_app
from continuum_listener.adapters.publisher import JetStreamPublisher
from continuum_listener.adapters.resync import ResyncResponder
from continuum_listener.adapters.trtllm_source import TrtllmSource
from continuum_listener.adapters.zap import ZapHandler
from continuum_listener.adapters.zmq_source import ZAP_DOMAIN_PREFIX, ZmqSource
from continuum_listener.attribution import Resolver
from continuum_listener.config import ListenerSettings, uses_detokenize
from continuum_listener.errors import ListenerError
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import EventSink, PipelineSettings, SourcePipeline
from continuum_listener.policy.chains import Limits
from continuum_listener.sse_hub import SseHub

log = logging.getLogger("continuum.listener")
DRAIN_DEADLINE_S = 5.0


class ListenerApp:
    def __init__(self, settings: ListenerSettings, *, heartbeat_interval: float = 5.0) -> None:
        cfg = settings.config
        self.settings = settings
        self.config = cfg
        backends = [s.backend_name for s in cfg.sources]
        self.metrics = ListenerMetrics(backends)
        self.pipelines: dict[str, SourcePipeline] = {}
        self.hub = SseHub(backends, history=cfg.limits.sse_history, state=self._announced, metrics=self.metrics)
        self.tracing = Tracing(cfg.tracing, "kv-listener")
        self.publisher: JetStreamPublisher | None = None
        if cfg.bus is not None:
            self.publisher = JetStreamPublisher(
                cfg.bus, self.metrics, capacity=cfg.limits.publish_buffer, on_overflow=self._overflow,
                tracing=self.tracing, window=cfg.limits.max_outstanding_acks,
            )  # fmt: skip
        sinks: list[EventSink] = [self.hub] if self.publisher is None else [self.hub, self.publisher]
        limits = cfg.limits
        self._pipeline_settings = PipelineSettings(
            limits=Limits(limits.max_chain_tokens, limits.max_tracked_blocks, limits.max_retained_tokens),
            coalesce_window=limits.coalesce_window_ms / 1000,
            max_prefix_length=cfg.max_prefix_length,
            secret=settings.secret,
            detokenize_concurrency=limits.detokenize_concurrency,
            keepalive=limits.keepalive_ms / 1000,
        )
        self._detokenizers: list[DetokenizeClient] = []
        for source in cfg.sources:
            self.pipelines[source.backend_name] = SourcePipeline(
                source, self._pipeline_settings, self.metrics, sinks, self._resolver(source),
                block_sink=self.publisher, flow=self.publisher,
            )  # fmt: skip
        host, _, port = cfg.listen.rpartition(":")  # validated host:port
        sse = frozenset(s.backend_name for s in cfg.sources if s.publishes_prefix)
        self.http = EmbeddedServer(build_app(self.hub, self.metrics, self.health, sse_backends=sse), host, int(port))
        self.heartbeat = (
            Heartbeat(self.publisher, list(self.pipelines.values()), interval=heartbeat_interval)
            if self.publisher is not None
            else None
        )
        self.zmq = zmq.asyncio.Context()
        self.started = asyncio.Event()
        self._stop = asyncio.Event()
        self.stopping = False

    # -- wiring helpers ----------------------------------------------------------------------------

    def _resolver(self, source: ListenerSource) -> Resolver | None:
        if not uses_detokenize(source):
            return None
        assert source.detokenize_endpoint is not None and source.model is not None
        backend = source.backend_name
        histogram = self.metrics.detokenize_seconds.labels(backend)
        client = DetokenizeClient(
            source.detokenize_endpoint, model=source.model, timeout=source.request_timeout_ms / 1000,
            observe=histogram.observe,
        )  # fmt: skip
        self._detokenizers.append(client)
        return Resolver(
            detokenize=client,
            family=source.chat_template,
            model=source.model,
            max_prefix_length=self.config.max_prefix_length,
            on_outcome=lambda outcome: self.metrics.detok(backend, outcome),
        )

    def _announced(self, backend: str) -> tuple[list[KvEvent], int, int]:
        pipeline = self.pipelines[backend]
        return pipeline.snapshot(), pipeline.sequencer.epoch, pipeline.sequencer.seq

    def _overflow(self, backend: str) -> None:
        pipeline = self.pipelines.get(backend)
        if pipeline is not None:
            pipeline.want_resync()

    def health(self) -> dict[str, Any]:
        sources = {
            name: {
                "engine": p.source.engine,
                "publish": p.source.publish,
                "connected": p.stats.connected,
                "events_received": p.stats.received,
                "events_dropped": p.stats.dropped,
                "last_event_at": p.stats.last_event_at,
                "source_epoch": p.sequencer.epoch,
                "block_seq": p.blocks.seq if p.blocks is not None else None,
                "sse_clients": self.hub.clients(name),
            }
            for name, p in self.pipelines.items()
        }
        publisher = self.publisher
        bus = (
            None
            if publisher is None
            else {
                "connected": publisher.connected,
                "pending": publisher.pending,
                "outstanding_acks": publisher.outstanding,
                "backpressure": publisher.blocked,
            }
        )
        return {"status": "draining" if self.stopping else "ok", "bus": bus, "sources": sources}

    async def _zap_allow_lists(self) -> dict[str, frozenset[str]]:
        loop = asyncio.get_running_loop()
        out: dict[str, frozenset[str]] = {}
        for source in self.config.sources:
            if source.engine == "trtllm" or source.zmq_mode != "bind":
                continue
            addresses: set[str] = set()
            for host in source.allowed_publishers:
                try:
                    addresses.add(str(ipaddress.ip_address(host)))
                except ValueError:  # a host name: every address it resolves to
                    infos = await loop.getaddrinfo(host, None)
                    addresses.update(str(info[4][0]) for info in infos)
            out[ZAP_DOMAIN_PREFIX + source.backend_name] = frozenset(addresses)
        return out

    def _denied(self, domain: str) -> None:
        backend = domain.removeprefix(ZAP_DOMAIN_PREFIX)
        if backend in self.pipelines:
            self.metrics.denied.labels(backend).inc()

    async def _supervise(self) -> None:
        """Resync backends whose events the publisher had to drop, once it has room again."""
        while True:
            await asyncio.sleep(0.5)
            publisher = self.publisher
            if publisher is None or not publisher.connected or publisher.room() < publisher.capacity // 2:
                continue
            for pipeline in self.pipelines.values():
                if pipeline.resync_wanted:
                    pipeline.resync(publisher.room() // 2)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.http.port

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        allow = await self._zap_allow_lists()
        background: list[asyncio.Task[Any]] = []
        sources: list[asyncio.Task[Any]] = []
        try:
            async with asyncio.TaskGroup() as tg:

                def spawn(into: list[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any], name: str) -> None:
                    into.append(tg.create_task(coro, name=name))

                if allow:
                    zap = ZapHandler(self.zmq, allow, self._denied)
                    spawn(sources, zap.run(), "zap")
                for pipeline in self.pipelines.values():
                    pipeline.start_epoch("start")
                    spawn(background, pipeline.run(), f"pipeline:{pipeline.backend}")
                    source = pipeline.source
                    adapter = (
                        TrtllmSource(source, pipeline)
                        if source.engine == "trtllm"
                        else ZmqSource(self.zmq, source, pipeline)
                    )
                    spawn(sources, adapter.run(), f"source:{pipeline.backend}")
                if self.publisher is not None:
                    spawn(background, self.publisher.run(), "publisher")
                    spawn(background, self._supervise(), "supervisor")
                    responder = ResyncResponder(self.publisher, self.pipelines, self.metrics)
                    spawn(background, responder.run(), "resync-requests")
                if self.heartbeat is not None:
                    spawn(background, self.heartbeat.run(), "heartbeat")
                spawn(background, measure_loop_lag(self.metrics.loop_lag.observe, self._stop), "loop-lag")
                http = tg.create_task(self.http.serve(), name="http")
                # uvicorn exposes readiness only as a flag.
                while not self.http.started and not http.done():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                log.info("listening on %s:%d with %d source(s)", self.http.host, self.http.port, len(self.pipelines))
                self.started.set()
                await self._stop.wait()
                await self._shutdown(sources, background, http)
        finally:
            for client in self._detokenizers:
                await client.aclose()
            self.zmq.destroy(linger=0)
            self.tracing.shutdown()

    async def _shutdown(
        self, sources: list[asyncio.Task[Any]], background: list[asyncio.Task[Any]], http: asyncio.Task[Any]
    ) -> None:
        self.stopping = True
        started = time.monotonic()
        await _cancel(sources)
        for pipeline in self.pipelines.values():
            pipeline.flush()
        self.hub.drain()
        if self.publisher is not None:
            await self.publisher.close(DRAIN_DEADLINE_S)
        await _cancel(background)
        self.http.request_stop()
        await http
        log.info("stopped in %.2fs", time.monotonic() - started)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def running(settings: ListenerSettings, **kwargs: Any) -> AsyncIterator[ListenerApp]:
    """Run a listener in the current event loop for the body of the `async with` (tests, `up`)."""
    app = ListenerApp(settings, **kwargs)
    task = asyncio.create_task(app.run(), name="continuum-kv-listener")
    started = asyncio.create_task(app.started.wait())
    await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        started.cancel()
        await task  # raises the start-up error
    try:
        yield app
    finally:
        app.stop()
        await task


async def serve(settings: ListenerSettings) -> None:
    """Run until SIGTERM / SIGINT (the console script). A socket that cannot be opened (the
    listen address or a ZMQ bind endpoint taken) raises ListenerError with the reason."""
    try:
        app = ListenerApp(settings)
    except OSError as exc:
        raise ListenerError(f"cannot listen on {settings.config.listen}: {exc.strerror}") from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, app.stop)
    # The sources' resident-block maps exist now and only grow: freezing them with the start-up
    # heap keeps full collections from walking every block the engines hold.
    settle_heap()
    try:
        await app.run()
    except* (OSError, zmq.ZMQError) as group:
        first = group.exceptions[0]
        raise ListenerError(f"cannot open a socket: {first}") from None
