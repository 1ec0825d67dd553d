"""RedisKvIndex: the shared KV index in Redis / Redis Cluster (key layout in ../keys.py).

Writes: one pipelined round trip per batch (an APPLY script per prefix, one ZADD to the LRU and
one per backend's reverse index), then one small round trip that re-reads the clear watermarks
of the batch's backends. Reads: one pipelined round trip for any number of prefixes. No command
ever names keys of two slots, so the same code runs on a single node and on Redis Cluster.

Why the watermark re-read: `cleared` raises the backend's watermark and then walks the
backend's reverse index. A replica applying an older event at the same moment may still have
passed the old watermark to APPLY. Either its reverse-index ZADD finished before the walk
started (the walk then clears the prefix), or its re-read sees the new watermark (it then
clears the prefix itself). Both are idempotent, so a `cleared` is never undone.
"""

from __future__ import annotations

import re
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisError

from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.events import KvEvent, Tier
from continuum_common.kvindex.adapters import scripts
from continuum_common.kvindex.batch import BatchPlan, EntryWrite, plan_batch
from continuum_common.kvindex.entry import TierPolicy
from continuum_common.kvindex.keys import KeyLayout
from continuum_common.kvindex.memory import DEFAULT_TOMBSTONE_GRACE_S
from continuum_common.kvindex.types import (
    COUNTER_NAMES,
    ApplyReport,
    BackendCounters,
    ClearReport,
    IndexStats,
    KvHolder,
    KvIndexError,
)
from continuum_common.redis_client import RedisClient

_APPLIED, _STARTED, _STOPPED = 1, 2, 4
_COUNTER_FLUSH_S = 1.0
_EVICT_LOCK_MS = 10_000
_CHUNK = 500
_HOLDERS_KEY = re.compile(r"[0-9a-f]{64}")
# Prefixes per APPLY call: bounds how long one script holds Redis (~0.1 ms per prefix).
_GROUP = 100


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _packed(prefixes: Iterable[str], touches: Mapping[str, int]) -> str:
    return ",".join(f"{touches[p]} {p}" for p in prefixes)


def _holders(rows: Sequence[tuple[bytes, float]], warm: set[bytes] | None) -> list[KvHolder]:
    held = [
        KvHolder(
            member.decode(),
            int(score),
            Tier.STORAGE_WARM if warm is not None and member in warm else Tier.GPU_HOT,
        )
        for member, score in rows
    ]
    held.sort(key=lambda h: (-h.token_count, h.backend))
    return held


class RedisKvIndex:
    def __init__(
        self,
        client: RedisClient,
        *,
        key_prefix: str = "cr:kvidx:",
        max_entries: int = 100_000,
        entry_ttl_seconds: int = 600,
        policy: TierPolicy | None = None,
        tombstone_grace_s: float = DEFAULT_TOMBSTONE_GRACE_S,
        owns_client: bool = False,
    ) -> None:
        self._redis = client
        self._cluster = isinstance(client, RedisCluster)
        self.owns_client = owns_client
        self.keys = KeyLayout(key_prefix)
        self.max_entries = max_entries
        self.ttl = int(entry_ttl_seconds)
        self.meta_ttl = int(entry_ttl_seconds + tombstone_grace_s)
        self.policy = policy or TierPolicy()
        self._shas: dict[str, str] = {}
        # Watermarks this process has seen; only an optimisation (APPLY re-checks via the re-read).
        self._watermarks: dict[str, str] = {}
        self._pending: dict[str, Counter[str]] = {}
        self._last_flush = time.monotonic()
        self._last_touch = 0

    @classmethod
    def from_config(
        cls, cfg: KvCacheIndex, client: RedisClient, *, tombstone_grace_s: float = DEFAULT_TOMBSTONE_GRACE_S
    ) -> RedisKvIndex:
        return cls(
            client,
            key_prefix=cfg.key_prefix,
            max_entries=cfg.max_entries,
            entry_ttl_seconds=cfg.entry_ttl_seconds,
            policy=TierPolicy.from_config(cfg),
            tombstone_grace_s=tombstone_grace_s,
        )

    # ---- plumbing --------------------------------------------------------------------------

    async def _load_scripts(self) -> dict[str, str]:
        if not self._shas:
            loaded = {}
            for name, body in (
                ("apply", scripts.APPLY),
                ("evict", scripts.EVICT),
                ("lru_forget", scripts.LRU_FORGET),
                ("watermark", scripts.RAISE_WATERMARK),
                ("zadd", scripts.ZADD_PACKED),
                ("unlock", scripts.UNLOCK),
            ):
                # On a cluster SCRIPT LOAD goes to every primary.
                loaded[name] = _text(await self._redis.script_load(body))
            self._shas = loaded
        return self._shas

    async def _call(self, op: Callable[[dict[str, str]], Awaitable[Any]]) -> Any:
        """Run `op` with the script SHAs; reload them once when Redis lost its script cache
        (a restart or failover), and turn every Redis failure into KvIndexError."""
        try:
            try:
                return await op(await self._load_scripts())
            except NoScriptError:
                self._shas = {}
                return await op(await self._load_scripts())
        except RedisError as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}") from exc

    async def _pipeline(self, build: Callable[[Any, dict[str, str]], None]) -> list[Any]:
        async def run(shas: dict[str, str]) -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            build(pipe, shas)
            result: list[Any] = await pipe.execute()
            return result

        result: list[Any] = await self._call(run)
        return result

    def _touch(self, count: int = 1) -> int:
        """The first of `count` strictly increasing write times in µs, so the LRU order is the
        write order even inside one batch."""
        first = max(self._last_touch + 1, time.time_ns() // 1000)
        self._last_touch = first + count - 1
        return first

    # ---- read side -------------------------------------------------------------------------

    async def query_backends(self, prefix_hash: str) -> list[KvHolder]:
        return (await self.query_many((prefix_hash,)))[prefix_hash]

    async def query_many(self, prefix_hashes: Iterable[str]) -> dict[str, list[KvHolder]]:
        prefixes = list(dict.fromkeys(prefix_hashes))
        if not prefixes:
            return {}
        tiers = self.policy.track_tiers

        def build(pipe: Any, _shas: dict[str, str]) -> None:
            for prefix_hash in prefixes:
                pipe.zrevrangebyscore(self.keys.holders(prefix_hash), "+inf", "-inf", withscores=True)
                if tiers:
                    pipe.smembers(self.keys.warm(prefix_hash))

        try:
            pipe = self._redis.pipeline(transaction=False)
            build(pipe, {})
            rows: list[Any] = await pipe.execute()
        except RedisError as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}") from exc
        step = 2 if tiers else 1
        return {p: _holders(rows[i * step], rows[i * step + 1] if tiers else None) for i, p in enumerate(prefixes)}

    # ---- write side ------------------------------------------------------------------------

    async def apply_batch(self, events: Sequence[KvEvent]) -> ApplyReport:
        plan = plan_batch(events, self.policy)
        report = ApplyReport(ignored=plan.ignored)
        for backend, stamp in plan.clears.items():
            await self._clear_backend(backend, stamp, report)
        if plan.entries:
            await self._apply_entries(plan, report)
        return report

    def _groups(self, prefixes: Sequence[str]) -> list[Sequence[str]]:
        """Prefixes that may share one script call: any, on a single node; on a cluster only
        those whose keys hash to the same slot."""
        if not self._cluster:
            return [prefixes[i : i + _GROUP] for i in range(0, len(prefixes), _GROUP)]
        by_slot: dict[int, list[str]] = {}
        for prefix_hash in prefixes:
            by_slot.setdefault(key_slot(self.keys.holders(prefix_hash).encode()), []).append(prefix_hash)
        return [group[i : i + _GROUP] for group in by_slot.values() for i in range(0, len(group), _GROUP)]

    def _apply_call(
        self, pipe: Any, sha: str, group: Sequence[str], touches: Mapping[str, int], blobs: Mapping[str, str]
    ) -> None:
        holders = self.keys.holders
        pipe.execute_command(
            "EVALSHA",
            sha,
            len(group),
            *[holders(p) for p in group],
            self.ttl,
            self.meta_ttl,
            1 if self.policy.track_tiers else 0,
            self.keys.prefix,
            *[f"{touches[p]}|{blobs[p]}" for p in group],
        )

    @staticmethod
    def _blob(writes: Sequence[EntryWrite], watermarks: Mapping[str, str]) -> str:
        return ";".join(
            f"{w.backend},{w.stamp},{watermarks.get(w.backend, '')},"
            f"{'' if w.writes.gpu is None else w.writes.gpu},{'' if w.writes.warm is None else w.writes.warm}"
            for w in writes
        )

    async def _apply_entries(self, plan: BatchPlan, report: ApplyReport) -> None:
        backends = plan.backends()
        await self._refresh_watermarks(backends - self._watermarks.keys())
        used = {b: self._watermarks.get(b, "") for b in backends}
        order = list(plan.entries)
        first = self._touch(len(order))
        touches = {prefix_hash: first + i for i, prefix_hash in enumerate(order)}
        blobs = {prefix_hash: self._blob(plan.entries[prefix_hash], used) for prefix_hash in order}
        by_backend: dict[str, list[str]] = {}
        for prefix_hash in order:
            for b in {w.backend for w in plan.entries[prefix_hash]}:
                by_backend.setdefault(b, []).append(prefix_hash)
        groups = self._groups(order)
        counters = self._take_counters(force=False)

        def build(pipe: Any, shas: dict[str, str]) -> None:
            for group in groups:
                self._apply_call(pipe, shas["apply"], group, touches, blobs)
            for b, prefixes in by_backend.items():
                pipe.execute_command("EVALSHA", shas["zadd"], 1, self.keys.reverse(b), _packed(prefixes, touches))
            pipe.sadd(self.keys.backends, *backends)
            self._add_counter_commands(pipe, counters)
            pipe.execute_command("EVALSHA", shas["zadd"], 1, self.keys.lru, _packed(order, touches))

        try:
            results = await self._pipeline(build)
        except KvIndexError:
            self._restore_counters(counters)
            raise
        entries = plan.entries
        self._count_codes(
            [w for group in groups for p in group for w in entries[p]],
            "".join(_text(codes) for codes in results[: len(groups)]),
            report,
        )
        await self._recheck_watermarks(plan, used, report)
        card = int(results[-1])
        if card > self.max_entries:
            await self._evict(card)

    def _count_codes(self, writes: Sequence[EntryWrite], codes: str, report: ApplyReport) -> None:
        tally: dict[str, list[int]] = {}  # backend -> [applied, stale, started, stopped]
        for write, digit in zip(writes, codes, strict=True):
            code = ord(digit) - 48
            counts = tally.get(write.backend)
            if counts is None:
                counts = tally[write.backend] = [0, 0, 0, 0]
            counts[0 if code & _APPLIED else 1] += 1
            if code & _STARTED:
                counts[2] += 1
            if code & _STOPPED:
                counts[3] += 1
        for backend, (applied, stale, started, stopped) in tally.items():
            pending = self._pending.setdefault(backend, Counter())
            pending["applied"] += applied
            pending["stale"] += stale
            report.applied += applied
            report.stale += stale
            if started:
                pending["index_created"] += started
                report.created[backend] += started
            if stopped:
                pending["index_evicted"] += stopped
                report.evicted[backend] += stopped

    async def _refresh_watermarks(self, backends: Iterable[str]) -> dict[str, str]:
        names = sorted(backends)
        if not names:
            return {}

        def build(pipe: Any, _shas: dict[str, str]) -> None:
            for b in names:
                pipe.get(self.keys.watermark(b))

        values = await self._pipeline(build)
        fresh = {b: _text(v) if v is not None else "" for b, v in zip(names, values, strict=True)}
        for b, v in fresh.items():
            if v > self._watermarks.get(b, ""):
                self._watermarks[b] = v
            else:
                self._watermarks.setdefault(b, v)
        return fresh

    async def _recheck_watermarks(self, plan: BatchPlan, used: Mapping[str, str], report: ApplyReport) -> None:
        fresh = await self._refresh_watermarks(used)
        for backend, watermark in fresh.items():
            if watermark > used[backend]:
                prefixes = [p for p, writes in plan.entries.items() if any(w.backend == backend for w in writes)]
                await self._clear_prefixes(backend, watermark, prefixes, report)

    async def _clear_backend(self, backend: str, stamp: str, report: ApplyReport) -> None:
        async def raise_watermark(shas: dict[str, str]) -> str:
            return _text(await self._redis.evalsha(shas["watermark"], 1, self.keys.watermark(backend), stamp))

        effective: str = await self._call(raise_watermark)
        if effective == stamp:
            report.clears += 1
            self._pending.setdefault(backend, Counter())["clears"] += 1
        self._watermarks[backend] = max(effective, self._watermarks.get(backend, ""))
        # Walk every prefix the backend ever wrote, even when the watermark was already this
        # high: a replica that crashed mid-walk left the rest to the redelivered `cleared`.
        cursor: int = 0
        while True:
            try:
                cursor, rows = await self._redis.zscan(self.keys.reverse(backend), cursor, count=_CHUNK)
            except RedisError as exc:
                raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
            except (OSError, TimeoutError) as exc:
                raise KvIndexError(f"redis: {type(exc).__name__}") from exc
            members: list[Any] = [m for m, _ in rows]
            await self._clear_prefixes(backend, effective, [_text(m) for m in members], report)
            if int(cursor) == 0:
                break

    async def _clear_prefixes(self, backend: str, watermark: str, prefixes: Sequence[str], report: ApplyReport) -> None:
        """Apply the backend's watermark to these prefixes now (APPLY with a no-write record)."""
        if not prefixes:
            return
        record = f"{backend},{watermark},{watermark},,"
        touch = self._touch()
        touches = dict.fromkeys(prefixes, touch)
        blobs = dict.fromkeys(prefixes, record)
        groups = self._groups(prefixes)

        def build(pipe: Any, shas: dict[str, str]) -> None:
            for group in groups:
                self._apply_call(pipe, shas["apply"], group, touches, blobs)

        for codes in await self._pipeline(build):
            stopped = sum(1 for digit in _text(codes) if int(digit) & _STOPPED)
            if stopped:
                report.evicted[backend] += stopped
                self._pending.setdefault(backend, Counter())["index_evicted"] += stopped

    async def _evict(self, card: int) -> None:
        """Over max_entries: delete the oldest 10 % (plus the overshoot) by last write."""
        count = card - self.max_entries + max(1, self.max_entries // 10)
        token = secrets.token_hex(8)
        try:
            if not await self._redis.set(self.keys.evict_lock, token, nx=True, px=_EVICT_LOCK_MS):
                return  # another replica is evicting right now
            oldest: list[Any] = await self._redis.zrange(self.keys.lru, 0, count - 1, withscores=True)
        except RedisError as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
        try:
            scores = {_text(m): int(s) for m, s in oldest}
            evicted = 0
            for start in range(0, len(oldest), _CHUNK):
                chunk = list(scores)[start : start + _CHUNK]
                groups = self._groups(chunk)

                def build(pipe: Any, shas: dict[str, str], chunk: list[str] = chunk, groups: Any = groups) -> None:
                    for group in groups:
                        keys = [k for p in group for k in self.keys.entry_keys(p)]
                        pipe.execute_command("EVALSHA", shas["evict"], len(keys), *keys, *(scores[p] for p in group))
                    pairs = [x for p in chunk for x in (p, scores[p])]
                    pipe.execute_command("EVALSHA", shas["lru_forget"], 1, self.keys.lru, *pairs)

                results = await self._pipeline(build)
                evicted += sum(int(r) for r in results[:-1])
            if evicted:
                await self._redis.hincrby(self.keys.global_counters, "evictions", evicted)
        except RedisError as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
        finally:
            try:
                await self._redis.evalsha(self._shas.get("unlock", ""), 1, self.keys.evict_lock, token)
            except (RedisError, OSError, TimeoutError):
                pass  # the lock expires on its own

    # ---- counters --------------------------------------------------------------------------

    def count_events(self, backend: str, *, received: int = 0, dropped: int = 0) -> None:
        pending = self._pending.setdefault(backend, Counter())
        pending["received"] += received
        pending["dropped"] += dropped

    def _take_counters(self, *, force: bool) -> dict[str, Counter[str]]:
        if not self._pending or (not force and time.monotonic() - self._last_flush < _COUNTER_FLUSH_S):
            return {}
        taken, self._pending = self._pending, {}
        self._last_flush = time.monotonic()
        return taken

    def _restore_counters(self, taken: Mapping[str, Counter[str]]) -> None:
        for backend, counts in taken.items():
            self._pending.setdefault(backend, Counter()).update(counts)

    def _add_counter_commands(self, pipe: Any, taken: Mapping[str, Counter[str]]) -> None:
        for backend, counts in taken.items():
            for name, value in counts.items():
                if value:
                    pipe.hincrby(self.keys.counters(backend), name, value)
            pipe.sadd(self.keys.backends, backend)

    async def flush_counters(self) -> None:
        taken = self._take_counters(force=True)
        if not taken:
            return
        try:
            await self._pipeline(lambda pipe, _shas: self._add_counter_commands(pipe, taken))
        except KvIndexError:
            self._restore_counters(taken)
            raise

    # ---- administration --------------------------------------------------------------------

    async def _backend_names(self) -> list[str]:
        try:
            members = await self._redis.smembers(self.keys.backends)
        except RedisError as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
        return sorted(_text(m) for m in members)

    async def cleanup_expired(self) -> int:
        """Trim the LRU and reverse-index sorted sets of prefixes whose keys have expired (the
        keys themselves expire in Redis), and flush the counters."""
        await self.flush_counters()
        backends = await self._backend_names()
        cutoff = time.time_ns() // 1000 - self.meta_ttl * 1_000_000

        def build(pipe: Any, _shas: dict[str, str]) -> None:
            pipe.zremrangebyscore(self.keys.lru, "-inf", cutoff)
            for b in backends:
                pipe.zremrangebyscore(self.keys.reverse(b), "-inf", cutoff)

        results = await self._pipeline(build)
        return int(results[0])

    async def stats(self) -> IndexStats:
        backends = await self._backend_names()
        live = time.time_ns() // 1000 - self.ttl * 1_000_000

        def build(pipe: Any, _shas: dict[str, str]) -> None:
            pipe.zcount(self.keys.lru, live, "+inf")
            pipe.hget(self.keys.global_counters, "evictions")
            for b in backends:
                pipe.zcount(self.keys.reverse(b), live, "+inf")

        results = await self._pipeline(build)
        return IndexStats(
            prefix_count=int(results[0]),
            entry_count=sum(int(r) for r in results[2:]),
            total_evictions=int(results[1] or 0),
            backend="redis",
        )

    async def backend_counters(self) -> Mapping[str, BackendCounters]:
        await self.flush_counters()
        backends = await self._backend_names()

        def build(pipe: Any, _shas: dict[str, str]) -> None:
            for b in backends:
                pipe.hgetall(self.keys.counters(b))

        results = await self._pipeline(build)
        out = {}
        for b, raw in zip(backends, results, strict=True):
            counts = {_text(k): int(v) for k, v in raw.items() if _text(k) in COUNTER_NAMES}
            out[b] = BackendCounters.from_counts(counts)
        return out

    async def clear(self) -> ClearReport:
        before = await self.stats()
        holders = 0
        batch: list[str] = []

        async def delete(keys: list[str]) -> None:
            def build(pipe: Any, _shas: dict[str, str]) -> None:
                for key in keys:  # one key per DEL: keys of different slots never share a command
                    pipe.delete(key)

            await self._pipeline(build)

        try:
            async for raw in self._redis.scan_iter(match=self.keys.match_all, count=1000):
                key = _text(raw)
                batch.append(key)
                if _HOLDERS_KEY.fullmatch(key, len(self.keys.prefix)):
                    holders += 1
                if len(batch) >= _CHUNK:
                    await delete(batch)
                    batch = []
            if batch:
                await delete(batch)
        except RedisError as exc:
            raise KvIndexError(f"redis: {type(exc).__name__}: {exc}") from exc
        self._watermarks.clear()
        self._pending.clear()
        return ClearReport(entries_before_clear=before.entry_count, cleared_entries=holders)

    async def close(self) -> None:
        try:
            await self.flush_counters()
        except KvIndexError:
            pass  # counters are best effort; the index itself is already written
        if self.owns_client:
            await self._redis.aclose()
