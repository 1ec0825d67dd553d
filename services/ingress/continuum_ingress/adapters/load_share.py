"""The shared load view: per-backend load to and from the other ingress replicas over core NATS
(continuum_common.wire.loads; the table is policy/shared_load.py).

Every `interval` this replica publishes what it has in flight on each backend and refreshes the
pool's `remote_in_flight` / `remote_queued_tokens` from the other replicas' latest reports, so
the CHWBL bound and the KV cost model, which read `BackendState.in_flight` and
`queued_tokens`, bound the fleet's load rather than this replica's share. A report received is
applied at once; so is a routing decision another replica shares (`bump`). Publishing never
waits on a slow bus for long: a report is skipped and counted while NATS is down, and peers'
reports expire after the staleness bound, so with the bus down every replica routes on its own
counts. On shutdown a final report tells the others to drop this replica's load at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from continuum_common.wire.loads import (
    SUBJECT_WILDCARD,
    BackendLoad,
    LoadReport,
    LoadReportDecodeError,
    decode_load_report,
    encode_load_report,
    subject_for,
)
from continuum_ingress.metrics import LoadShareMetrics
from continuum_ingress.policy.shared_load import SharedLoad
from continuum_ingress.pool import BackendPool

log = logging.getLogger("continuum.ingress.load")

FINAL_REPORT_TIMEOUT_S = 1.0


class LoadShare:
    def __init__(
        self,
        nc: NatsClient,
        replica: str,
        pool: BackendPool,
        *,
        interval_s: float,
        stale_after_s: float,
        metrics: LoadShareMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nc = nc
        self.replica = replica
        self.subject = subject_for(replica)
        self.pool = pool
        self.interval_s = interval_s
        self.table = SharedLoad(stale_after_s)
        self.metrics = metrics
        self.clock = clock
        self._seq = 0
        self._expired_seen = 0
        self._sub: Subscription | None = None
        self._stopped = False  # after the final report nothing more is published

    async def run(self) -> None:
        """Subscribe, then publish and refresh every interval until cancelled."""
        self._sub = await self.nc.subscribe(SUBJECT_WILDCARD, cb=self._received)
        try:
            while True:
                await self._publish(final=False)
                self.refresh()
                await asyncio.sleep(self.interval_s)
        finally:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def stop(self) -> None:
        """Tell the other replicas to drop this one's load now (best effort)."""
        self._stopped = True
        with contextlib.suppress(Exception):
            async with asyncio.timeout(FINAL_REPORT_TIMEOUT_S):
                await self._publish(final=True)
                await self.nc.flush()

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
        return LoadReport(self.replica, self._seq, max(1, round(self.interval_s * 1000)), loads, final)

    async def _publish(self, *, final: bool) -> None:
        if self._stopped and not final:
            return
        if not self.nc.is_connected:
            self.metrics.dropped.labels("bus_down").inc()
            return
        try:
            await self.nc.publish(self.subject, encode_load_report(self.report(final=final)))
        except Exception as exc:  # nats-py raises several types when disconnected
            self.metrics.dropped.labels("publish_failed").inc()
            log.debug("load report not published: %s", type(exc).__name__)
            return
        self.metrics.sent.inc()

    async def _received(self, msg: Msg) -> None:
        if msg.subject == self.subject:
            return
        try:
            report = decode_load_report(msg.data)
        except LoadReportDecodeError:
            self.metrics.dropped.labels("decode").inc()
            return
        if report.replica == self.replica:
            return
        if not self.table.apply(report, self.clock()):
            self.metrics.dropped.labels("reordered").inc()
            return
        self.metrics.received.inc()
        self.refresh()
