"""KvRouting: Tier 4 inside the ingress, as one `Component` (hooks.py).

Built by the app when `kv_cache_index.enabled` (a restart-only section). It owns:

* the selector (`KvSelector`, kv/selector.py), which the pipeline runs for requests with a
  prefix key, i.e. exactly while `prefix_routing.enabled` (hot-reloadable) is also on, whatever
  the strategy; it matches requests per match group (precise / approximate / prefix_key) and
  delegates prefix-key groups to the seed's scorer (`KvOverlapScorer`);
* the block index it reads (engine block hashes): the embedded InMemoryBlockIndex (memory) or a
  read-only RedisBlockIndex (redis), through `BlockReads`;
* the decision share (kv/adapters/decisions.py): routing decisions, and what the engines'
  `/tokenize` answered, to and from the other ingress replicas over NATS, and the replay of
  what they shared before this process started (the route history,
  kv/adapters/route_history.py);
* the hand-off of the other replicas' routing decisions to the shared load view
  (load_share.py, which the app owns and runs on this component's NATS connection);
* a watch that forgets what was recorded about a backend whose engine cleared its cache (the
  block index's per-backend generation);
* the prefix-key index it reads:
  - `backend: memory`: an embedded index (kv/embedded.py), an InMemoryKvIndex in this process
    fed by a private JetStream consumer (it replays the last entry TTL of the stream, then
    follows it) and by the `transport: sse` sources; no indexer process, no Redis. The launcher
    passes the factory that builds it (`embedded_index`);
  - `backend: redis`: a RedisKvIndex used read-only (the indexer service writes it), on the
    process's shared Redis client (`app.redis`, which the response cache uses too; followed
    across hot-reload swaps), else on a client of its own;
* a NATS connection, made in the background, for the embedded feed, the indexer's admin
  request/reply and the listener heartbeats;
* the admin routes `GET /admin/kv-index/stats`, `GET /admin/kv-index/backends`,
  `POST /admin/kv-index/clear` (kv/admin.py; `kv_admin_routes`, kv/__init__.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig
from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.errors import ConfigError
from continuum_common.kvindex import KvIndex
from continuum_common.kvindex.blocks import BlockIndexReader, MatchQuery
from continuum_common.wire.decisions import Decision, Tokenized, replica_id
from continuum_ingress.adapters.nats_link import NatsLink
from continuum_ingress.kv.adapters.bus import BusReader
from continuum_ingress.kv.adapters.decisions import DecisionShare
from continuum_ingress.kv.block_reads import BlockReads
from continuum_ingress.kv.embedded import EmbeddedIndex, EmbeddedIndexFactory
from continuum_ingress.kv.metrics import KvScorerMetrics
from continuum_ingress.kv.scorer import KvOverlapScorer
from continuum_ingress.kv.selector import KvSelector
from continuum_ingress.kv.speculative import SpeculativeEntries
from continuum_ingress.load_share import LoadShare
from continuum_ingress.policy.kv_scoring import Weights
from continuum_ingress.shared_client import SharedClient

if TYPE_CHECKING:  # redis-py is imported only with `backend: redis`
    from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
    from continuum_common.redis_client import RedisClient

log = logging.getLogger("continuum.ingress.kv")

STOP_GRACE_S = 5.0
HANDOVER_S = 2.0  # at shutdown: lessons in flight, then the queued decisions, out to NATS
GENERATION_WATCH_S = 1.0


class KvRouting:
    def __init__(
        self,
        config: RouterConfig,
        registry: CollectorRegistry,
        *,
        link: NatsLink,
        redis: SharedClient | None = None,
        embedded_index: EmbeddedIndexFactory | None = None,
        embedded_maintenance_s: float = 30.0,
    ) -> None:
        """`link`: the process's NATS connection (its owner starts and closes it)."""
        section = config.kv_cache_index
        if section.backend == "memory" and embedded_index is None:
            raise ConfigError(
                "kv_cache_index.backend: memory needs the embedded KV index, which `continuum-router serve` "
                "and `continuum-router up` provide; built without it, use backend: redis"
            )
        self.config = config
        self.section = section
        self.registry = registry
        self.link = link
        self.nc = link.nc
        self.bus = BusReader(self.nc, config.bus.request_timeout_ms / 1000)
        self.speculative = SpeculativeEntries(section.speculative_ttl_ms / 1000)
        self.metrics = KvScorerMetrics(
            registry, lambda: float(len(self.speculative)), lambda: float(self.selector.recorded_entries())
        )
        self.prefix_scorer = KvOverlapScorer(
            Weights.from_config(section.scoring),
            speculative=self.speculative,
            observe_query=self._observe_query,
            on_speculative_route=self.metrics.speculative_routes.inc,
        )
        self.block_reads = BlockReads(observe=self._observe_block_read)
        self.replica = replica_id(socket.gethostname(), os.getpid(), secrets.token_hex(3))
        # Raises ConfigError for an unreadable tokenizer / chat template of a precise group.
        self.selector = KvSelector(
            config,
            prefix_scorer=self.prefix_scorer,
            block_reads=self.block_reads,
            metrics=self.metrics,
            replica=self.replica,
        )
        self.scorer = self.selector
        self.decisions: DecisionShare | None = None
        # The shared load view, when the app runs one (it counts the decisions shared here).
        self.load_share: LoadShare | None = None
        self._generations: dict[str, int] = {}
        self._embedded_index = embedded_index
        self.embedded: EmbeddedIndex | None = None
        self.redis_index: RedisKvIndex | None = None
        self._shared_redis = redis
        self._owned_redis: RedisClient | None = None
        self._embedded_maintenance_s = embedded_maintenance_s
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.ready = asyncio.Event()  # the index is fed (memory) / NATS is connected (redis)
        self.history_settled = asyncio.Event()  # the route history was replayed (or cannot be)
        self.connected = link.connected  # NATS is connected (once; nats-py reconnects itself)

    @property
    def backend(self) -> str:
        return self.section.backend

    @property
    def warm(self) -> bool:
        """The index is fed and the route history replayed: routing as well as it will."""
        return self.ready.is_set() and self.history_settled.is_set()

    # ---- Component -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._embedded_index is not None and self.backend == "memory":
            # Built now so its metrics exist from the first scrape; it starts consuming once
            # NATS is connected.
            self.embedded = self._embedded_index(
                self.config, self.nc, registry=self.registry, maintenance_interval_s=self._embedded_maintenance_s
            )
            self.prefix_scorer.index = self.embedded.index
            self.block_reads.index = self.embedded.blocks
        else:
            self.prefix_scorer.index = self._open_redis()
        w = self.section.scoring
        c = w.cost
        log.info(
            "KV scorer on (%s index, scoring %s): overlap_weight=%g load_weight=%g health_weight=%g "
            "min_overlap_threshold=%g gpu_tier_weight=%g storage_tier_weight=%g speculative_ttl_ms=%d "
            "prefill_tokens_per_second=%g per_request_ms=%g storage_token_cost=%g groups=%s",
            self.backend, w.model, w.overlap_weight, w.load_weight, w.health_weight, w.min_overlap_threshold,
            w.gpu_tier_weight, w.storage_tier_weight, self.section.speculative_ttl_ms,
            c.prefill_tokens_per_second, c.per_request_ms, c.storage_token_cost,
            ",".join(f"{g.name}:{g.mode}" for g in self.selector.groups.values()),
        )  # fmt: skip
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kv-routing")

    def _open_redis(self) -> KvIndex:
        """Read-only use (query_many, and stats for admin): the indexer writes. On the process's
        shared client, followed across hot-reload swaps; without one, on a client of its own."""
        shared = self._shared_redis
        client = shared.client if shared is not None else None
        if client is None:
            from continuum_common.redis_client import make_redis

            connection = self.config.redis_connection()
            assert connection is not None  # the schema requires one for backend: redis
            client = self._owned_redis = make_redis(connection)
        elif shared is not None:
            shared.on_swap.append(self._swap_redis)
        from continuum_common.kvindex.adapters.redis_index import RedisKvIndex

        self.redis_index = RedisKvIndex.from_config(self.section, client)
        self.block_reads.index = _redis_blocks(self.section, client)
        return self.redis_index

    def _swap_redis(self, client: RedisClient | None) -> None:
        if client is None:  # the connection went away from the config: keep reading the old one
            return
        from continuum_common.kvindex.adapters.redis_index import RedisKvIndex

        self.redis_index = RedisKvIndex.from_config(self.section, client)
        self.prefix_scorer.index = self.redis_index
        self.block_reads.index = _redis_blocks(self.section, client)

    async def _run(self) -> None:
        try:
            await self.connected.wait()
            async with asyncio.TaskGroup() as tasks:
                side = [tasks.create_task(self._share_decisions()), tasks.create_task(self._watch_generations())]
                if self.embedded is None:
                    self.ready.set()
                else:
                    watcher = tasks.create_task(self.embedded.ready.wait())
                    watcher.add_done_callback(lambda t: None if t.cancelled() else self.ready.set())
                    await self.embedded.run()
                    if self._closing:  # the feed finished its batch: the rest stops with it
                        for task in (*side, watcher):
                            task.cancel()
        except Exception:  # the scorer keeps answering from what it has; requests fall back
            log.exception("the KV index feed stopped")

    async def _share_decisions(self) -> None:
        selector = self.selector
        tokenized = selector.apply_tokenized if selector.shares_tokenizations else None
        share = DecisionShare(
            self.nc,
            self.replica,
            self._remote_decision,
            on_drop=self._decision_dropped,
            on_tokenized=tokenized,
            history=self.section.route_history if selector.share_decisions else None,
            history_replicas=self.config.bus.stream.replicas,
            on_restored=self._restored,
            on_replayed=self._replayed,
            on_duplicate=self.metrics.history_duplicates.inc,
        )
        self.decisions = share
        if share.history is None:
            self.history_settled.set()
        selector.share = self._offer_decision
        if tokenized is not None:
            selector.share_tokenizations(share.offer_tokenized)
        await share.run()

    def _offer_decision(self, decision: Decision) -> None:
        share = self.decisions
        if share is not None:
            share.offer(decision)
            self.metrics.decisions_sent.inc()

    def _remote_decision(self, decision: Decision) -> None:
        self.metrics.decisions_received.inc()
        self.selector.apply_remote(decision)
        if self.load_share is not None:
            self.load_share.bump(decision.replica, decision.backend, decision.new_tokens)

    def _restored(self, message: Decision | Tokenized) -> None:
        """A message of the route history: applied with its age, not counted as load now."""
        if isinstance(message, Decision):
            self.selector.apply_remote(message, restored=True)
            self.metrics.history_restored.labels("decision").inc()
        else:
            self.selector.apply_tokenized(message, "restored")
            self.metrics.history_restored.labels("tokenization").inc()

    def _replayed(self, result: str, handed: int) -> None:
        self.metrics.history_replays.labels(result).inc()
        self.history_settled.set()

    def _decision_dropped(self, reason: str) -> None:
        self.metrics.decisions_dropped.labels(reason).inc()

    async def _watch_generations(self) -> None:
        """Forget what was recorded about a backend whose engine lost its cache: the block
        index's per-backend generation changes when a backend is cleared, restarts or expires."""
        backends = [b.name for b in self.config.backends]
        while True:
            await asyncio.sleep(GENERATION_WATCH_S)
            try:
                found = await self._generations_now(backends)
            except Exception as exc:  # the index is down: nothing learnt this round
                log.debug("generation watch: %s", type(exc).__name__)
                continue
            for backend, generation in found.items():
                before = self._generations.get(backend)
                self._generations[backend] = generation
                if before is not None and before != generation:
                    log.info("backend %s lost its KV cache (generation %d); forgetting its routes", backend, generation)
                    self.selector.wipe(backend)

    async def _generations_now(self, backends: list[str]) -> dict[str, int]:
        index = self.block_reads.index
        if index is None:
            return {}
        if hasattr(index, "match_nowait"):
            found = index.match_nowait((), backends)
        else:
            found = (await index.match_many([MatchQuery((), backends)]))[0]
        return {b: m.generation for b, m in found.items()}

    def reload(self, config: RouterConfig) -> None:
        """Nothing to do: kv_cache_index is restart-only (the config holder warns about a
        change); prefix_routing.enabled, which gates the scorer, is read per request."""

    async def aclose(self) -> None:
        self._closing = True
        await self._hand_over()
        if self.embedded is not None:
            self.embedded.stop()
        task = self._task
        if task is not None and not task.done():
            if self.embedded is not None and self.nc.is_connected:  # let the feed finish the batch in hand
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STOP_GRACE_S):
                        await asyncio.shield(task)
            task.cancel()  # still connecting (NATS down), or past the grace period
            await asyncio.gather(task, return_exceptions=True)
        await self.prefix_scorer.aclose()
        await self.block_reads.aclose()
        await self.selector.aclose()
        if self._owned_redis is not None:
            with contextlib.suppress(Exception):
                await self._owned_redis.aclose()

    async def _hand_over(self) -> None:
        """What this process learnt last (the off-path tokenizations of the last answers, the
        decisions still queued) goes to the other replicas and the route history before NATS
        is let go; bounded by HANDOVER_S."""
        try:
            async with asyncio.timeout(HANDOVER_S):
                await self.selector.settle()
                share = self.decisions
                if share is not None and self.nc.is_connected:
                    await share.drain()
        except TimeoutError:
            log.warning("shutdown: routing messages still queued after %.0f s were not shared", HANDOVER_S)
        except Exception as exc:  # NATS went away meanwhile: nothing more to hand over
            log.debug("shutdown hand-over: %s", type(exc).__name__)

    # ---- seams -----------------------------------------------------------------------------

    def _observe_block_read(self, seconds: float, queries: int) -> None:
        if seconds < 0:
            self.metrics.block_read_errors.inc()
            return
        self.metrics.block_read_seconds.observe(seconds)

    def _observe_query(self, seconds: float, asked: int, held: int) -> None:
        if seconds < 0:
            self.metrics.query_errors.inc()
            return
        self.metrics.query_seconds.observe(seconds)
        self.metrics.hits.inc(held)
        self.metrics.misses.inc(asked - held)


def _redis_blocks(section: KvCacheIndex, client: RedisClient) -> BlockIndexReader:
    from continuum_common.kvindex.adapters.redis_blocks import RedisBlockIndex

    index: BlockIndexReader = RedisBlockIndex.from_config(section, client)
    return index
