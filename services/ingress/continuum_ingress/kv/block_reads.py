"""Reads of the block index for the scorer: coalesced, bounded, failing fast.

* The embedded memory index (`match_nowait`) is read inline: a dict walk, no await.
* A Redis index is read with `match_many`: every request that asks in the same event-loop turn
  joins one call (one pipelined round trip for all of them). Each read is bounded by
  `timeout_s`; after a failure the index is not asked again for `backoff_s`, so an outage costs
  each request an immediate fallback (KvIndexUnavailable), not a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from continuum_common.kvindex.blocks import BlockIndexReader, BlockMatch, MatchQuery
from continuum_common.kvindex.types import KvIndexError

log = logging.getLogger("continuum.ingress.kv")

READ_TIMEOUT_S = 1.0
BACKOFF_S = 0.5


class KvIndexUnavailable(KvIndexError):
    """The block index failed recently; not asked again yet."""


class SyncBlockIndex(Protocol):
    def match_nowait(self, chain: Sequence[int], backends: Sequence[str]) -> dict[str, BlockMatch]: ...


class BlockReads:
    def __init__(
        self,
        *,
        timeout_s: float = READ_TIMEOUT_S,
        backoff_s: float = BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[float, int], None] | None = None,
    ) -> None:
        self.index: BlockIndexReader | SyncBlockIndex | None = None
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.clock = clock
        self._observe = observe  # (seconds, queries) per read; seconds < 0 = a failed read
        self._pending: list[tuple[MatchQuery, asyncio.Future[dict[str, BlockMatch]]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._down_until = float("-inf")
        self.errors = 0

    async def match(self, chain: Sequence[int], backends: Sequence[str]) -> dict[str, BlockMatch]:
        index = self.index
        if index is None:
            raise KvIndexUnavailable("the block index is not open yet")
        if hasattr(index, "match_nowait"):
            started = time.perf_counter()
            result = index.match_nowait(chain, backends)
            if self._observe is not None:
                self._observe(time.perf_counter() - started, 1)
            return result
        if self.clock() < self._down_until:
            raise KvIndexUnavailable("the block index failed recently")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, BlockMatch]] = loop.create_future()
        future.add_done_callback(_retrieve)  # a waiter that gave up must not leave it unread
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((MatchQuery(chain, backends), future))
        # Shielded: a request that gives up leaves the shared read running for the others.
        return await asyncio.shield(future)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._read(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read(self, batch: list[tuple[MatchQuery, asyncio.Future[dict[str, BlockMatch]]]]) -> None:
        index = self.index
        started = time.perf_counter()
        try:
            assert index is not None and not hasattr(index, "match_nowait")
            async with asyncio.timeout(self.timeout_s):
                results = await index.match_many([q for q, _ in batch])
        except Exception as exc:  # any failure of the read is an index outage for routing
            error = exc if isinstance(exc, KvIndexError) else KvIndexError(f"block index read: {type(exc).__name__}")
            self._down_until = self.clock() + self.backoff_s
            self.errors += 1
            log.warning("block index read failed (%s); falling back for %.1fs", type(exc).__name__, self.backoff_s)
            if self._observe is not None:
                self._observe(-1.0, len(batch))
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        if self._observe is not None:
            self._observe(time.perf_counter() - started, len(batch))
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _retrieve(future: asyncio.Future[dict[str, BlockMatch]]) -> None:
    if not future.cancelled():
        future.exception()
