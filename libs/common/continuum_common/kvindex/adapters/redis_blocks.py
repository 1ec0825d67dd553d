"""RedisBlockIndex: the block index in Redis / Redis Cluster (layout in ../block_keys.py,
scripts in block_scripts.py), with the semantics of continuum_common.kvindex.blocks.

* Writes: the batches of one call are grouped per backend in arrival order and each group is
  ONE APPLY script call (split when it holds more than `max_blocks_per_call` block events, so
  no script holds Redis for long); the calls of all backends go in one pipelined round trip.
* Reads: `match_many` is ONE pipelined round trip with one MATCH call per (query, backend),
  the chain packed in one argument.
* Every call names the keys of one backend only (one slot), so the same code runs on a single
  node and on Redis Cluster.
* A lost script cache (Redis restarted, failover) answers NOSCRIPT: the scripts are loaded
  again and only the calls that failed are re-sent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from redis.exceptions import NoScriptError, RedisError

from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.kvindex.adapters import block_scripts
from continuum_common.kvindex.block_keys import BlockKeys
from continuum_common.kvindex.block_memory import DEFAULT_TOMBSTONE_SECONDS
from continuum_common.kvindex.block_pack import (
    Part,
    group_by_backend,
    pack_chain,
    pack_parts,
    seq_in_range,
    split_by_size,
)
from continuum_common.kvindex.blocks import (
    NO_MATCH,
    BlockApplyReport,
    BlockBackendStats,
    BlockIndexStats,
    BlockMatch,
    MatchQuery,
)
from continuum_common.kvindex.types import KvIndexError
from continuum_common.redis_client import RedisClient
from continuum_common.wire.kv import KvBatch

_SCRIPTS: Final = {
    "apply": block_scripts.APPLY,
    "match": block_scripts.MATCH,
    "stats": block_scripts.STATS,
    "clear": block_scripts.CLEAR,
}
# Block events per APPLY call (~3-4 µs each in Redis): no script holds Redis for more than
# about 15 ms, so reads are never stuck behind a long one.
DEFAULT_BLOCKS_PER_CALL = 4096
# Block events per pipeline: a backlog's big pull batches go in several round trips, each well
# within the client's command timeout even when a few indexer tasks share one Redis.
DEFAULT_BLOCKS_PER_PIPELINE = 16_384
# How often a writer re-adds a backend to the registry set (it may have been pruned or lost).
_REGISTRY_REFRESH_S = 30.0

_Call = tuple[str, Sequence[str], Sequence[Any]]


def _part_blocks(part: Part) -> int:
    return part.blocks


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisBlockIndex:
    def __init__(
        self,
        client: RedisClient,
        *,
        key_prefix: str = "cr:kvidx:",
        max_blocks: int = 100_000,
        ttl_seconds: float = 600.0,
        tombstone_seconds: float = DEFAULT_TOMBSTONE_SECONDS,
        max_blocks_per_call: int = DEFAULT_BLOCKS_PER_CALL,
        max_blocks_per_pipeline: int = DEFAULT_BLOCKS_PER_PIPELINE,
        owns_client: bool = False,
    ) -> None:
        self._redis = client
        self.owns_client = owns_client
        self.keys = BlockKeys(key_prefix)
        self.max_blocks = max_blocks
        self.ttl_ms = max(1, round(ttl_seconds * 1000))
        self.tombstone_ms = max(1, round(tombstone_seconds * 1000))
        self.max_blocks_per_call = max_blocks_per_call
        self.max_blocks_per_pipeline = max_blocks_per_pipeline
        self._shas: dict[str, str] = {}
        self._registered: dict[str, float] = {}  # backend -> when this process last SADDed it

    @classmethod
    def from_config(
        cls, cfg: KvCacheIndex, client: RedisClient, *, tombstone_seconds: float = DEFAULT_TOMBSTONE_SECONDS
    ) -> RedisBlockIndex:
        """On a client the caller owns (the ingress reads with one of these on its shared
        client; the index never closes it)."""
        return cls(
            client,
            key_prefix=cfg.key_prefix,
            max_blocks=cfg.max_entries,
            ttl_seconds=cfg.entry_ttl_seconds,
            tombstone_seconds=tombstone_seconds,
        )

    # ---- plumbing --------------------------------------------------------------------------

    async def _load_scripts(self) -> dict[str, str]:
        if not self._shas:
            # On a cluster SCRIPT LOAD goes to every primary.
            self._shas = {name: _text(await self._redis.script_load(body)) for name, body in _SCRIPTS.items()}
        return self._shas

    async def _execute(self, calls: Sequence[_Call], extra: Sequence[Sequence[Any]]) -> list[Any]:
        shas = await self._load_scripts()
        pipe = self._redis.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.execute_command("EVALSHA", shas[name], len(keys), *keys, *args)
        for command in extra:
            pipe.execute_command(*command)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    async def _eval(self, calls: Sequence[_Call], extra: Sequence[Sequence[Any]] = ()) -> list[Any]:
        """Run the script calls (then the plain `extra` commands) in one pipelined round trip.
        Calls refused with NOSCRIPT are re-sent once after loading the scripts again; any
        other failure raises KvIndexError (every write is idempotent: the caller retries)."""
        try:
            results = await self._execute(calls, extra)
            retry = [i for i, r in enumerate(results[: len(calls)]) if isinstance(r, NoScriptError)]
            if retry:
                self._shas = {}
                again = await self._execute([calls[i] for i in retry], ())
                for i, result in zip(retry, again, strict=True):
                    results[i] = result
        except RedisError as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}") from exc
        for result in results:
            if isinstance(result, Exception):
                raise KvIndexError(f"redis: {type(result).__name__}: {result}") from result
        return results

    async def _backend_names(self) -> list[str]:
        try:
            members = await self._redis.smembers(self.keys.registry)
        except RedisError as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}") from exc
        return sorted(_text(m) for m in members)

    # ---- read side -------------------------------------------------------------------------

    async def match_many(self, queries: Sequence[MatchQuery]) -> list[dict[str, BlockMatch]]:
        calls: list[_Call] = []
        for query in queries:
            chain = pack_chain(query.chain)
            for backend in dict.fromkeys(query.backends):
                calls.append(("match", self.keys.backend(backend)[:3], (chain,)))
        if not calls:
            return [{} for _ in queries]
        results = iter(await self._eval(calls))
        out: list[dict[str, BlockMatch]] = []
        for query in queries:
            matches: dict[str, BlockMatch] = {}
            for backend in dict.fromkeys(query.backends):
                gpu, any_, held, gen = next(results)
                gen = int(gen)
                matches[backend] = BlockMatch(int(gpu), int(any_), int(held), gen) if gen else NO_MATCH
            out.append(matches)
        return out

    # ---- write side ------------------------------------------------------------------------

    async def apply_batches(self, batches: Sequence[KvBatch]) -> BlockApplyReport:
        """One APPLY call per backend (split beyond `max_blocks_per_call` block events, a big
        batch into parts), in pipelines of at most `max_blocks_per_pipeline` block events:
        usually one round trip. When one fails, the ones before it stay applied; re-applying
        them is a no-op."""
        report = BlockApplyReport()
        pipelines: list[list[_Call]] = [[]]
        owners: list[list[str]] = [[]]  # the backend of each call
        size = 0
        groups = group_by_backend(batches)
        for backend, group in groups.items():
            keys = self.keys.backend(backend)
            parts: list[Part] = []
            for batch in group:
                if seq_in_range(batch):
                    parts += pack_parts(batch, self.max_blocks_per_call)
                else:  # read as stale, like the memory index does
                    report.stale_batches += 1
                    report.stale += batch.block_count
            for run in split_by_size(parts, self.max_blocks_per_call, _part_blocks):
                blocks = sum(p.blocks for p in run)
                if pipelines[-1] and size + blocks > self.max_blocks_per_pipeline:
                    pipelines.append([])
                    owners.append([])
                    size = 0
                args = (self.ttl_ms, self.max_blocks, self.tombstone_ms, *(p.packed for p in run))
                pipelines[-1].append(("apply", keys, args))
                owners[-1].append(backend)
                size += blocks
        if not pipelines[0]:
            return report
        now = time.monotonic()
        fresh = [b for b in groups if now - self._registered.get(b, -_REGISTRY_REFRESH_S) >= _REGISTRY_REFRESH_S]
        created: set[str] = set()
        for n, (calls, names) in enumerate(zip(pipelines, owners, strict=True)):
            extra = [("SADD", self.keys.registry, *fresh)] if fresh and n == 0 else []
            results = await self._eval(calls, extra)
            for backend, row in zip(names, results[: len(calls)], strict=True):
                n_batches, applied, stale, stale_batches, clears, evicted, made, gap = (int(v) for v in row)
                report.merge(BlockApplyReport(n_batches, applied, stale, stale_batches, clears, evicted))
                if made:
                    created.add(backend)
                if gap:
                    report.gaps.add(backend)
        for backend in fresh:
            self._registered[backend] = now
        if created - set(fresh):
            # A state made from nothing (its keys had expired or Redis lost them): list it in
            # the registry now, not at the next refresh, so stats see it at once.
            await self._eval([], [("SADD", self.keys.registry, *sorted(created))])
            for backend in created:
                self._registered[backend] = now
        return report

    # ---- administration --------------------------------------------------------------------

    async def cleanup(self) -> int:
        """The backends' keys expire in Redis on their own (PEXPIRE, refreshed by every batch)
        and tombstones rotate inside APPLY; this prunes the registry of backends whose state
        expired and returns how many went."""
        names = await self._backend_names()
        if not names:
            return 0
        exists = await self._eval([], [("EXISTS", self.keys.backend(b)[0]) for b in names])
        gone = [b for b, alive in zip(names, exists, strict=True) if not int(alive)]
        if gone:
            await self._eval([], [("SREM", self.keys.registry, *gone)])
            for backend in gone:
                self._registered.pop(backend, None)
        return len(gone)

    async def block_stats(self) -> BlockIndexStats:
        names = await self._backend_names()
        if not names:
            return BlockIndexStats({})
        results = await self._eval([("stats", self.keys.backend(b)[:3], ()) for b in names])
        out: dict[str, BlockBackendStats] = {}
        for name, row in zip(names, results, strict=True):
            if not row:
                continue  # expired: the registry is pruned by cleanup()
            gpu, storage, epoch, age_ms, gen, batches, applied, stale, stale_batches, clears, evicted = row
            out[name] = BlockBackendStats(
                gpu_blocks=int(gpu),
                storage_blocks=int(storage),
                source_epoch=int(epoch),
                last_batch_age_s=int(age_ms) / 1000 if int(age_ms) >= 0 else None,
                generation=int(gen),
                batches=int(batches),
                applied=int(applied),
                stale=int(stale),
                stale_batches=int(stale_batches),
                clears=int(clears),
                evicted=int(evicted),
            )
        return BlockIndexStats(out)

    async def clear_blocks(self) -> int:
        names = await self._backend_names()
        if not names:
            return 0
        results = await self._eval(
            [("clear", self.keys.backend(b), ()) for b in names], [("SREM", self.keys.registry, *names)]
        )
        self._registered.clear()
        return sum(int(r) for r in results[: len(names)])

    async def close(self) -> None:
        if self.owns_client:
            await self._redis.aclose()
