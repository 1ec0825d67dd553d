"""The shared load view: per-backend load to and from the other ingress processes
(continuum_common.wire.loads; the table is policy/shared_load.py), over one or more transports.

Every `interval` this process publishes what it has in flight on each backend and refreshes the
pool's `remote_in_flight` / `remote_queued_tokens` from the other processes' latest reports, so
the CHWBL bound and the KV cost model, which read `BackendState.in_flight` and
`queued_tokens`, bound the fleet's load rather than this process's share. A report received is
applied at once; so is a routing decision another replica shares (`bump`).

Transports (`LoadTransport`, load_transport.py): core NATS between replicas (adapters/load_nats.py) and Unix
datagram sockets between the workers of one `serve` (adapters/load_local.py). A process may use
both: its siblings' reports then arrive twice with the same sequence number, and the second copy
is ignored. Publishing never waits: a report that cannot go out is counted as a drop, and
peers' reports expire after the staleness bound, so with every transport down each process
routes on its own counts. On shutdown a final report tells the others to drop this process's
load at once.

The reports also carry the Responses ids this process learnt since its previous report
(`SharedResponses`, response_affinity.py), so the others route those conversations' next turns
without asking the backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig
from continuum_common.wire.loads import (
    MAX_RESPONSES,
    BackendLoad,
    LearnedResponse,
    LoadReport,
    LoadReportDecodeError,
    decode_load_report,
    encode_load_report,
)
from continuum_ingress.load_transport import Delivery, LoadTransport
from continuum_ingress.metrics import LoadShareMetrics
from continuum_ingress.policy.shared_load import SharedLoad
from continuum_ingress.pool import BackendPool

log = logging.getLogger("continuum.ingress.load")

FINAL_REPORT_TIMEOUT_S = 1.0


class SharedResponses(Protocol):
    """Response ids learnt here go out with the reports; the others' come in."""

    def take_shared(self, limit: int) -> list[tuple[str, str]]:
        """Up to `limit` (response id, backend) pairs learnt since the last call."""
        ...

    def adopt(self, pairs: Sequence[tuple[str, str]]) -> None: ...


class LoadShare:
    """A `Component` of the ingress app (hooks.py): started with it, closed after the last
    request (a final report, then the transports)."""

    def __init__(
        self,
        replica: str,
        pool: BackendPool,
        transports: Sequence[LoadTransport],
        *,
        interval_s: float,
        stale_after_s: float,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
        responses: SharedResponses | None = None,
    ) -> None:
        self.replica = replica
        self.responses = responses
        self.pool = pool
        self.transports = tuple(transports)
        self.interval_s = interval_s
        self.table = SharedLoad(stale_after_s)
        self.metrics = LoadShareMetrics(registry, lambda: float(len(self.table)))
        self.clock = clock
        self._seq = 0
        self._expired_seen = 0
        self._stopped = False  # after the final report nothing more is published
        self._task: asyncio.Task[None] | None = None

    # ---- Component -------------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="load-share")

    def reload(self, config: RouterConfig) -> None:
        """Nothing: load_sharing is a restart-only section."""

    async def aclose(self) -> None:
        await self.stop()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for transport in self.transports:
            with contextlib.suppress(Exception):
                await transport.close()

    # ---- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Open every transport (each in its own time: NATS may still be connecting), then
        publish and refresh every interval until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            for transport in self.transports:
                tasks.create_task(self._open(transport))
            while True:
                await self._publish(final=False)
                self.refresh()
                await asyncio.sleep(self.interval_s)

    async def _open(self, transport: LoadTransport) -> None:
        try:
            await transport.open(self._received)
        except Exception:  # the others keep working; this one counts its reports as dropped
            log.exception("load view: the %s transport did not open", transport.name)

    async def stop(self) -> None:
        """Tell the other processes to drop this one's load now (best effort, bounded)."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            async with asyncio.timeout(FINAL_REPORT_TIMEOUT_S):
                await self._publish(final=True)
                for transport in self.transports:
                    if transport.connected:
                        await transport.flush()

    def bump(self, replica: str, backend: str, queued_tokens: int) -> None:
        """Another replica routed a request to `backend` (its shared decision)."""
        if self.table.bump(replica, backend, queued_tokens):
            state = self.pool.get(backend)
            if state is not None:
                state.remote_in_flight += 1
                state.remote_queued_tokens += queued_tokens

    def refresh(self) -> None:
        """Write the fresh peers' totals into the pool (0 where no peer reports load)."""
        totals = self.table.totals(self.clock())
        expired = self.table.expired - self._expired_seen
        if expired:
            self._expired_seen = self.table.expired
            self.metrics.expired.inc(expired)
        for state in self.pool.states():
            state.remote_in_flight = totals.in_flight.get(state.name, 0)
            state.remote_queued_tokens = totals.queued_tokens.get(state.name, 0)

    def report(self, *, final: bool = False) -> LoadReport:
        self._seq += 1
        loads = (
            []
            if final
            else [
                BackendLoad(s.name, s.local_in_flight, s.local_queued_tokens)
                for s in self.pool.states()
                if s.local_in_flight > 0 or s.local_queued_tokens > 0
            ]
        )
        learnt = [] if self.responses is None else self.responses.take_shared(MAX_RESPONSES)
        shared = [LearnedResponse(response_id, backend) for response_id, backend in learnt]
        return LoadReport(self.replica, self._seq, max(1, round(self.interval_s * 1000)), loads, final, shared)

    async def _publish(self, *, final: bool) -> None:
        if self._stopped and not final:
            return
        # One report (one sequence number) for every transport, so a copy that arrives twice
        # is recognised.
        payload = encode_load_report(self.report(final=final))
        for transport in self.transports:
            delivery = await transport.publish(payload)
            if delivery.sent:
                self.metrics.sent.inc(delivery.sent)
            for reason in delivery.dropped:
                self.metrics.dropped.labels(reason).inc()

    def _received(self, payload: bytes) -> None:
        try:
            report = decode_load_report(payload)
        except LoadReportDecodeError:
            self.metrics.dropped.labels("decode").inc()
            return
        if report.replica == self.replica:
            return
        if self.table.last_seq(report.replica) == report.seq:
            return  # the same report over a second transport
        if report.responses and self.responses is not None:  # facts even when reordered
            self.responses.adopt([(r.response_id, r.backend) for r in report.responses])
        if not self.table.apply(report, self.clock()):
            self.metrics.dropped.labels("reordered").inc()
            return
        self.metrics.received.inc()
        self.refresh()


__all__ = ["Delivery", "LoadShare", "LoadTransport"]
