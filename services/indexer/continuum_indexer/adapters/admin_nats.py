"""Admin over NATS request/reply: `continuum.indexer.admin.stats|backends|clear` (JSON);
`stats` has a `blocks` section, `clear` forgets the prefix index and the block index.

All replicas subscribe in one queue group, so each request is answered once; the answers are
fleet-wide where the index keeps the numbers (Redis), replica-local for connection state."""

from __future__ import annotations

import logging
import socket
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import Error as JsError

from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.kvindex import BlockIndexWriter, KvIndexError, KvIndexWriter
from continuum_common.wire import indexer_admin as admin
from continuum_indexer.config import ADMIN_QUEUE_GROUP
from continuum_indexer.index_feeds import IndexFeeds
from continuum_indexer.metrics import IndexerMetrics

log = logging.getLogger("continuum.indexer.admin")


class AdminResponder:
    def __init__(
        self,
        nc: NatsClient,
        cfg: KvCacheIndex,
        index: KvIndexWriter,
        feeds: IndexFeeds,
        metrics: IndexerMetrics,
        *,
        blocks: BlockIndexWriter | None = None,
    ) -> None:
        self.nc = nc
        self.cfg = cfg
        self.index = index
        self.blocks = blocks if blocks is not None else feeds.blocks
        self.feeds = feeds
        self.metrics = metrics
        self.replica = f"{socket.gethostname()}:{id(self):x}"
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(admin.ADMIN_SUBJECT_WILDCARD, queue=ADMIN_QUEUE_GROUP, cb=self._on_request)

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # the connection may already be closing
                log.debug("admin unsubscribe: %s", type(exc).__name__)

    async def _on_request(self, msg: Msg) -> None:
        verb = admin.verb_of(msg.subject)
        try:
            body = await self.answer(verb)
        except KvIndexError as exc:
            self.metrics.errors.labels("admin").inc()
            body = admin.error_body("index_unavailable", str(exc))
        if msg.reply:
            try:
                await msg.respond(admin.encode_reply(body))
            except Exception as exc:  # the requester went away
                log.debug("admin reply failed: %s", type(exc).__name__)

    async def answer(self, verb: str) -> dict[str, Any]:
        if verb == "stats":
            return admin.stats_body(
                self.cfg,
                await self.index.stats(),
                self.feeds.source_stats(),
                await self._consumer_info(),
                self.replica,
                blocks=await self.blocks.block_stats(),
            )
        if verb == "backends":
            return admin.backends_body(self.cfg, await self.index.backend_counters(), self.feeds.source_stats())
        if verb == "clear":
            # blocks first: the Redis prefix index's clear deletes every key under the prefix
            blocks = await self.blocks.clear_blocks()
            report = await self.index.clear()
            log.info("index cleared by admin request: %d prefixes, %d blocks", report.cleared_entries, blocks)
            return admin.clear_body(report, blocks)
        return admin.error_body("unknown_verb", "expected stats, backends or clear")

    async def _consumer_info(self) -> dict[str, Any] | None:
        durable = self.feeds.settings.consumer.durable
        if durable is None:
            return None
        try:
            info = await self.nc.jetstream().consumer_info("CONTINUUM_KV", durable, timeout=1.0)
        except (JsError, TimeoutError, OSError) as exc:
            return {"durable": durable, "error": type(exc).__name__}
        return {
            "durable": durable,
            "num_pending": info.num_pending,
            "num_ack_pending": info.num_ack_pending,
            "num_redelivered": info.num_redelivered,
        }
