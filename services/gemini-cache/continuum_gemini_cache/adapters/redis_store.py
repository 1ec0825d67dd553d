"""The shared state in Redis/Valkey (production; survives restarts, shared by replicas).

Keys (`P` = `gemini_context_cache.key_prefix`, default `cr:gem:`). Every key carries the hash
tag `{gem}`, so they live in one Redis Cluster slot and each operation is one atomic Lua script
(Cluster-safe multi-key work, DESIGN.md §6):

    P{gem}:e           hash    <backend>:<digest> -> entry JSON
    P{gem}:n           hash    <backend>:<digest> -> negative entry JSON
    P{gem}:lru         zset    e:<id> | n:<id> -> last use (service clock, s); both kinds share it
    P{gem}:exp         zset    e:<id> | n:<id> -> expiry (service clock, s); expired pruned first
    P{gem}:cnt         hash    e:<backend> | n:<backend> -> live record count (for stats)
    P{gem}:lock:<id>   string  single-flight create lock, SET NX PX (random token)
    P{gem}:inflight    zset    <id> -> lock deadline (Redis TIME, ms); counts in-flight creates
    P{gem}:ext:<id>    string  extend-on-hit lock, SET NX PX
    P{gem}:stats       hash    <backend>|<counter> -> count, shared by every replica
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import RedisError

from continuum_common.redis_client import RedisClient
from continuum_common.wire.gemini import GeminiRecordError
from continuum_gemini_cache.errors import StateError
from continuum_gemini_cache.model import Counts, Entry, Found, LookupState, NegativeEntry, Removal, Removed

_HELPERS = """
local function rm(member)
  local kind = string.sub(member, 1, 1)
  local id = string.sub(member, 3)
  local h = KEYS[2]
  if kind == 'e' then h = KEYS[1] end
  local v = redis.call('HGET', h, id)
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
  if v then
    redis.call('HDEL', h, id)
    local field = kind .. ':' .. string.match(id, '^([^:]+):')
    if tonumber(redis.call('HINCRBY', KEYS[5], field, -1)) <= 0 then redis.call('HDEL', KEYS[5], field) end
  end
  return v
end
local function prune(now, limit, out)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(dead) do
    local v = rm(m)
    if v then table.insert(out, 'expired'); table.insert(out, m); table.insert(out, v) end
  end
end
"""

_LOOKUP = (
    _HELPERS
    + """
local id, now = ARGV[1], tonumber(ARGV[2])
local expired = ''
local ev = redis.call('HGET', KEYS[1], id)
if ev then
  local at = tonumber(redis.call('ZSCORE', KEYS[4], 'e:' .. id))
  if at and at > now then
    if ARGV[3] == '1' then redis.call('ZADD', KEYS[3], now, 'e:' .. id) end
    return {'hit', ev, redis.call('ZSCORE', KEYS[3], 'e:' .. id) or '0'}
  end
  rm('e:' .. id)
  expired = ev
end
local nv = redis.call('HGET', KEYS[2], id)
if nv then
  local at = tonumber(redis.call('ZSCORE', KEYS[4], 'n:' .. id))
  if at and at > now then return {'negative', nv} end
  rm('n:' .. id)
end
return {'miss', expired, redis.call('EXISTS', KEYS[6])}
"""
)

_PUT = (
    _HELPERS
    + """
local kind, id, now, maxn = ARGV[1], ARGV[2], tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
local old = rm('e:' .. id)
if old then table.insert(out, 'replaced'); table.insert(out, 'e:' .. id); table.insert(out, old) end
rm('n:' .. id)
local total = redis.call('ZCARD', KEYS[3])
prune(now, math.max(64, total - maxn + 1), out)
total = redis.call('ZCARD', KEYS[3])
while total >= maxn do
  local victim = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not victim then break end
  local v = rm(victim)
  if v then table.insert(out, 'evicted'); table.insert(out, victim); table.insert(out, v) end
  total = total - 1
end
local h = KEYS[2]
if kind == 'e' then h = KEYS[1] end
redis.call('HSET', h, id, ARGV[3])
redis.call('ZADD', KEYS[3], now, kind .. ':' .. id)
redis.call('ZADD', KEYS[4], ARGV[4], kind .. ':' .. id)
redis.call('HINCRBY', KEYS[5], kind .. ':' .. ARGV[7], 1)
return out
"""
)

_PRUNE = (
    _HELPERS
    + """
local out = {}
prune(tonumber(ARGV[1]), tonumber(ARGV[2]), out)
return out
"""
)

_UPDATE_EXPIRY = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
if cjson.decode(v)['name'] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[4], 'e:' .. ARGV[1])
return 1
"""

_DROP = (
    _HELPERS
    + """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return false end
if cjson.decode(v)['name'] ~= ARGV[2] then return false end
rm('e:' .. ARGV[1])
return v
"""
)

_CLEAR = """
local vals = redis.call('HVALS', KEYS[1])
local negatives = redis.call('HLEN', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
table.insert(vals, 1, tostring(negatives))
return vals
"""

_LOCK = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
if KEYS[2] then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2]), ARGV[3])
end
return 1
"""

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[2]) end
  return 1
end
return 0
"""

_IN_FLIGHT = """
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
return redis.call('ZCARD', KEYS[1])
"""


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _removed(flat: Sequence[Any]) -> list[Removed]:
    out: list[Removed] = []
    for i in range(0, len(flat) - 2, 3):
        reason, member, data = Removal(_s(flat[i])), _s(flat[i + 1]), flat[i + 2]
        if member.startswith("e:"):
            out.append(Removed(reason, entry=_read(Entry.from_json, data)))
        else:
            out.append(Removed(reason, negative=_read(NegativeEntry.from_json, data)))
    return out


class RedisStore:
    kind = "redis"

    def __init__(self, client: RedisClient, key_prefix: str) -> None:
        self._client = client
        base = f"{key_prefix}{{gem}}:"
        self._base = base
        self._keys = [base + "e", base + "n", base + "lru", base + "exp", base + "cnt"]
        self._inflight = base + "inflight"
        self._stats = base + "stats"
        self._lookup = client.register_script(_LOOKUP)
        self._put = client.register_script(_PUT)
        self._prune = client.register_script(_PRUNE)
        self._update = client.register_script(_UPDATE_EXPIRY)
        self._drop = client.register_script(_DROP)
        self._clear = client.register_script(_CLEAR)
        self._lock = client.register_script(_LOCK)
        self._unlock = client.register_script(_UNLOCK)
        self._in_flight = client.register_script(_IN_FLIGHT)

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except RedisError as exc:
            raise StateError(f"redis: {type(exc).__name__}") from exc

    async def lookup(self, backend: str, digest: str, now: float, *, touch: bool) -> LookupState:
        rid = f"{backend}:{digest}"
        keys = [*self._keys, f"{self._base}lock:{rid}"]
        reply = await self._call(self._lookup, keys, [rid, repr(now), "1" if touch else "0"])
        kind = _s(reply[0])
        if kind == "hit":
            return LookupState(Found.HIT, entry=_read(Entry.from_json, reply[1], last_use=float(_s(reply[2]))))
        if kind == "negative":
            return LookupState(Found.NEGATIVE, negative=_read(NegativeEntry.from_json, reply[1]))
        expired = _read(Entry.from_json, reply[1]) if reply[1] else None
        return LookupState(Found.MISS, in_flight=bool(int(reply[2])), expired=expired)

    async def _put_record(
        self, kind: str, record: Entry | NegativeEntry, expiry: float, now: float, max_n: int
    ) -> list[Removed]:
        args = [kind, record.id, record.to_json(), repr(expiry), repr(now), max_n, record.backend]
        return _removed(await self._call(self._put, self._keys, args))

    async def put_entry(self, entry: Entry, now: float, max_entries: int) -> list[Removed]:
        return await self._put_record("e", entry, entry.expire_at, now, max_entries)

    async def put_negative(self, negative: NegativeEntry, now: float, max_entries: int) -> list[Removed]:
        return await self._put_record("n", negative, negative.until, now, max_entries)

    async def prune_expired(self, now: float, limit: int) -> list[Removed]:
        return _removed(await self._call(self._prune, self._keys, [repr(now), limit]))

    async def update_expiry(self, entry: Entry, expire_at: float, ttl_seconds: float) -> bool:
        updated = dataclasses.replace(entry, expire_at=expire_at, ttl_seconds=ttl_seconds)
        args = [entry.id, entry.name, updated.to_json(), repr(expire_at)]
        return bool(await self._call(self._update, self._keys, args))

    async def drop(self, backend: str, digest: str, name: str) -> Entry | None:
        reply = await self._call(self._drop, self._keys, [f"{backend}:{digest}", name])
        return _read(Entry.from_json, reply) if reply else None

    async def clear(self) -> tuple[list[Entry], int]:
        reply = await self._call(self._clear, self._keys, [])
        return [_read(Entry.from_json, v) for v in reply[1:]], int(_s(reply[0]))

    async def acquire_create_lock(self, backend: str, digest: str, token: str, ttl_ms: int) -> bool:
        rid = f"{backend}:{digest}"
        keys = [f"{self._base}lock:{rid}", self._inflight]
        return bool(await self._call(self._lock, keys, [token, ttl_ms, rid]))

    async def release_create_lock(self, backend: str, digest: str, token: str) -> None:
        rid = f"{backend}:{digest}"
        await self._call(self._unlock, [f"{self._base}lock:{rid}", self._inflight], [token, rid])

    async def acquire_extend_lock(self, backend: str, digest: str, token: str, ttl_ms: int) -> bool:
        return bool(await self._call(self._lock, [f"{self._base}ext:{backend}:{digest}"], [token, ttl_ms, ""]))

    async def counts(self) -> Counts:
        try:
            raw = await self._client.hgetall(self._keys[4])
        except RedisError as exc:
            raise StateError(f"redis: {type(exc).__name__}") from exc
        in_flight = int(await self._call(self._in_flight, [self._inflight], []))
        per: dict[str, list[int]] = {}
        for field, value in raw.items():
            kind, _, backend = _s(field).partition(":")
            per.setdefault(backend, [0, 0])[0 if kind == "e" else 1] += int(_s(value))
        return Counts(
            entries=sum(v[0] for v in per.values()),
            negative_entries=sum(v[1] for v in per.values()),
            in_flight=in_flight,
            per_backend={b: (v[0], v[1]) for b, v in per.items()},
        )

    async def add_counters(self, deltas: Mapping[str, int]) -> None:
        if not deltas:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for field, delta in deltas.items():
                pipe.hincrby(self._stats, field, delta)
            await pipe.execute()
        except RedisError as exc:
            raise StateError(f"redis: {type(exc).__name__}") from exc

    async def read_counters(self) -> dict[str, int]:
        try:
            raw = await self._client.hgetall(self._stats)
        except RedisError as exc:
            raise StateError(f"redis: {type(exc).__name__}") from exc
        return {_s(k): int(_s(v)) for k, v in raw.items()}

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except RedisError:
            return False

    async def aclose(self) -> None:
        await self._client.aclose()


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _read(parse: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """A stored record, or StateError: the store holds a record this version cannot read."""
    try:
        return parse(*args, **kwargs)
    except GeminiRecordError as exc:
        raise StateError(str(exc)) from None
