"""Active health checks: GET the backend's health path on its own interval.

Self-hosted engines (vllm, sglang, trtllm) are checked on `/health` unless the config names
another path; hosted APIs (openai, anthropic, gemini) only when `health_check_path` is set, so
the router does not spend a paid provider's quota on probes. Two failures in a row take a
backend out of rotation (the second check comes at most 1 s after the first failure); taking a
backend out releases the requests still waiting for its first byte (they are retried elsewhere).
One success brings it back. Passive detection (the circuit breaker)
works for every backend regardless.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from continuum_common.config import Backend
from continuum_ingress.config_holder import ConfigHolder
from continuum_ingress.pool import BackendPool
from continuum_ingress.transport import UpstreamError

log = logging.getLogger(__name__)

SELF_HOSTED = frozenset({"vllm", "sglang", "trtllm"})
CHECK_TIMEOUT_S = 2.0
RECHECK_AFTER_FAILURE_S = 1.0


def health_path(spec: Backend) -> str | None:
    if spec.health_check_path:
        return spec.health_check_path
    return "/health" if spec.type in SELF_HOSTED else None


class HealthChecker:
    def __init__(
        self, holder: ConfigHolder, pool: BackendPool, clock: Callable[[], float] = time.monotonic, tick: float = 0.1
    ) -> None:
        self.holder = holder
        self.pool = pool
        self.clock = clock
        self.tick = tick
        self._next_due: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.check_due()
            except Exception:  # never let a probe bug stop the loop
                log.exception("health check round failed")
            try:
                await asyncio.wait_for(stop.wait(), self.tick)
            except TimeoutError:
                pass

    async def check_due(self) -> None:
        snapshot = self.holder.current
        now = self.clock()
        due: list[tuple[Backend, str]] = []
        for spec in snapshot.config.backends:
            path = health_path(spec)
            if not spec.enabled or path is None or spec.name not in snapshot.clients:
                continue
            if self._next_due.get(spec.name, 0.0) <= now:
                self._next_due[spec.name] = now + spec.health_check_interval_ms / 1000
                due.append((spec, path))
        if due:
            await asyncio.gather(*(self._check(spec, path, snapshot.api_keys.get(spec.name)) for spec, path in due))

    async def _check(self, spec: Backend, path: str, key: str | None) -> None:
        client = self.holder.current.clients.get(spec.name)
        state = self.pool.get(spec.name)
        if client is None or state is None:
            return
        headers = [("authorization", f"Bearer {key}")] if key else []
        timeout = min(CHECK_TIMEOUT_S, spec.health_check_interval_ms / 1000)
        try:
            async with asyncio.timeout(timeout + spec.connect_timeout_ms / 1000):
                response = await client.transport.request("GET", client.target(path), headers, read_timeout=timeout)
                try:
                    await response.read()
                finally:
                    await response.aclose()
            ok = 200 <= response.status < 300
        except (UpstreamError, TimeoutError):
            ok = False
        if not ok and state.healthy:
            # One failure: check again soon, so a hung backend is taken out within seconds,
            # not two full intervals.
            self._next_due[spec.name] = min(self._next_due.get(spec.name, 0.0), self.clock() + RECHECK_AFTER_FAILURE_S)
        if state.record_health(ok):
            if ok:
                log.info("backend %s is healthy again", spec.name)
            else:
                cut = state.cut_first_byte_waits()
                log.warning(
                    "backend %s failed its health checks; taken out of rotation (%d request(s) waiting for it moved)",
                    spec.name,
                    cut,
                )
