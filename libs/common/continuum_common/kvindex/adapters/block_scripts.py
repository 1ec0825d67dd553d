"""Lua scripts of RedisBlockIndex. Every call names the keys of ONE backend (one cluster slot:
they share the hash tag `{backend}`, see ../block_keys.py); the batches and chains travel
packed (../block_pack.py), one argument each.

Per tier the present blocks are a hash (block -> stamp of its store: what reads and the
last-writer-wins checks look up, with HMGET: a few times cheaper per block than ZMSCORE, whose
double replies Lua must parse) and a sorted set of the same blocks by stamp (the store order:
`max_blocks` pops its lowest, AllCleared removes a score range).

APPLY implements continuum_common.kvindex.blocks exactly as InMemoryBlockIndex does:

* a register's `(stamp, present)` is the newest of: its stamp in the tier's hash (present), its
  tombstone in t0 or t1 (absent); the clear watermark `wm` reads every register at or below it
  as absent (AllCleared deletes those blocks at once);
* a store is one HMGET, one HSET and one ZADD per event for all its hashes. Tombstones are
  looked up only when the stamp is not newer than `tmax`, the newest tombstone stamp: in-order
  delivery never looks;
* a run of consecutive removal events (vLLM sends one per evicted block) is one HMGET, one HDEL
  and one ZREM; tombstones are written once per batch (`pend`, consulted before t0/t1 so later
  events of the batch see them);
* tombstones rotate: every `tomb_ms` (or when t0 holds over 2 * max_blocks) t1 is dropped and
  t0 becomes t1, so a tombstone lives one to two windows;
* beyond `max_blocks` present blocks in a tier, the lowest stamps (the oldest stored) are
  popped and become tombstones;
* `gen` becomes max(gen + 1, server time in µs) on every wipe (new epoch, AllCleared, first
  batch after expiry): it changes even across the expiry that deletes the old value;
* every batch that is not stale refreshes `seen` and the PEXPIRE (liveness TTL) of all keys.

Stamps are Lua numbers (doubles): exact because seq < 2**37 (block_pack.MAX_SEQ). They are
written back with %d, never with tostring (which keeps 14 digits).
"""

from __future__ import annotations

# KEYS: m, g, s, go, so, t0, t1.  ARGV: ttl_ms, max_blocks, tomb_ms, then one packed part each
# (a batch, or a part of a big one: ../block_pack.py).
# Returns {batches, applied, stale, stale_batches, clears, evicted, created, gap}: `created` when
# the backend's state was made from nothing, `gap` when moreover the batch did not start an epoch.
APPLY = r"""
local M, T0, T1 = KEYS[1], KEYS[6], KEYS[7]
local HELD, ORDER, TAG = {[0] = KEYS[2], [1] = KEYS[3]}, {[0] = KEYS[4], [1] = KEYS[5]}, {[0] = 'g', [1] = 's'}
local ttl_ms, maxb, tomb_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local CHUNK = 1000
local sub = string.sub
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local m = redis.call('HMGET', M, 'ep', 'wm', 'gen', 'tmax', 'rot',
  'c_batches', 'c_applied', 'c_stale', 'c_stale_batches', 'c_clears', 'c_evicted', 'pg', 'ps')
local ep, wm, gen, tmax, rot = m[1], tonumber(m[2]) or -1, tonumber(m[3]) or 0, tonumber(m[4]) or -1,
  tonumber(m[5]) or now_ms
-- per tier, the newest stamp of a present block (an upper bound): an event newer than it and
-- than `tmax` is newer than every register of the tier, so it needs no lookups at all
local pmax = {[0] = tonumber(m[12]) or -1, [1] = tonumber(m[13]) or -1}
local c = {batches = 0, applied = 0, stale = 0, stale_batches = 0, clears = 0, evicted = 0, created = 0, gap = 0}
local pend = {}  -- tombstone field -> stamp, written to t0 at the end of each batch
local npend = 0

local function fmt(x) return string.format('%d', x) end

-- n 8-byte hashes from blob at pos, as a table (struct.unpack's 'c8' slices in C, up to 1000
-- at a time: Lua's C stack bounds how many values one call returns)
local C8 = {}
local function hashes(blob, pos, n)
  local out = {}
  for first = 0, n - 1, 1000 do
    local k = math.min(1000, n - first)
    local f = C8[k]
    if not f then f = string.rep('c8', k); C8[k] = f end
    local part = {struct.unpack(f, blob, pos + 8 * first)}
    for j = 1, k do out[first + j] = part[j] end
  end
  return out
end
local function new_gen() gen = math.max(gen + 1, now_us) end

-- redis.call(cmd, key, <prefix...>, items...) in chunks (Lua's unpack has a stack limit)
local function each_chunk(cmd, key, items, step)
  local out = {}
  for first = 1, #items, CHUNK * step do
    local r = redis.call(cmd, key, unpack(items, first, math.min(#items, first + CHUNK * step - 1)))
    if type(r) == 'table' then
      for _, v in ipairs(r) do out[#out + 1] = v end
    end
  end
  return out
end

local function hmget(key, hs)
  local out = {}
  for first = 1, #hs, CHUNK do
    local last = math.min(#hs, first + CHUNK - 1)
    local r = redis.call('HMGET', key, unpack(hs, first, last))
    for k = 1, last - first + 1 do out[first + k - 1] = r[k] end
  end
  return out
end

local function tomb(f)
  local p = pend[f]
  if p then return p end  -- written in this batch: newer than t0/t1
  local a = tonumber(redis.call('HGET', T0, f)) or -1
  local b = tonumber(redis.call('HGET', T1, f)) or -1
  if a > b then return a end
  return b
end

local function put_tomb(f, st)
  if not pend[f] then npend = npend + 1 end
  pend[f] = st
  if st > tmax then tmax = st end
end

local function flush_tombs()
  if npend == 0 then return end
  local args = {}
  for f, st in pairs(pend) do
    args[#args + 1] = f
    args[#args + 1] = fmt(st)
  end
  each_chunk('HSET', T0, args, 2)
  pend, npend = {}, 0
end

local function drop(tier, hs)  -- present blocks leave the tier's hash and order
  if #hs == 0 then return end
  each_chunk('HDEL', HELD[tier], hs, 1)
  each_chunk('ZREM', ORDER[tier], hs, 1)
end

local function evict(tier)
  local over = redis.call('HLEN', HELD[tier]) - maxb
  if over <= 0 then return end
  local popped = redis.call('ZPOPMIN', ORDER[tier], over)
  local hs = {}
  for j = 1, #popped, 2 do
    hs[#hs + 1] = popped[j]
    put_tomb(TAG[tier] .. popped[j], tonumber(popped[j + 1]))
  end
  each_chunk('HDEL', HELD[tier], hs, 1)
  c.evicted = c.evicted + #hs
end

local function store(tier, blob, pos, n, st)
  local tag, check = TAG[tier], st <= tmax
  local hs = hashes(blob, pos, n)
  local old = {}
  if st <= pmax[tier] or check then old = hmget(HELD[tier], hs) end
  if st > pmax[tier] then pmax[tier] = st end
  local s = fmt(st)
  local seen, held, order = {}, {}, {}
  for k = 1, n do
    local h, v = hs[k], old[k]
    if seen[h] or (v and tonumber(v) >= st) or ((not v) and check and tomb(tag .. h) >= st) then
      c.stale = c.stale + 1
    else
      seen[h] = true
      held[#held + 1] = h
      held[#held + 1] = s
      order[#order + 1] = s
      order[#order + 1] = h
    end
  end
  if #held > 0 then
    each_chunk('HSET', HELD[tier], held, 2)
    each_chunk('ZADD', ORDER[tier], order, 2)
    c.applied = c.applied + #held / 2
    evict(tier)
  end
end

-- hs[k] removed at stamp sts[k] (a run of consecutive removal events of one tier)
local function remove(tier, hs, sts)
  local tag = TAG[tier]
  -- sts ascend: when the first is newer than every register, all are (no lookups; HDEL and
  -- ZREM of a block not present do nothing)
  local fast = sts[1] > pmax[tier] and sts[1] > tmax
  local old = {}
  if not fast then old = hmget(HELD[tier], hs) end
  local gone = {}
  for k = 1, #hs do
    local h, st, v = hs[k], sts[k], old[k]
    local f = tag .. h
    local p = pend[f]
    if (p and p >= st) or (v and tonumber(v) >= st) or ((not v) and (not fast) and st <= tmax and tomb(f) >= st) then
      c.stale = c.stale + 1
    else
      if v or fast then gone[#gone + 1] = h end
      put_tomb(f, st)
      c.applied = c.applied + 1
    end
  end
  drop(tier, gone)
end

local function clear(st)
  if st <= wm then return end
  wm = st
  for tier = 0, 1 do
    local top = redis.call('ZRANGE', ORDER[tier], -1, -1, 'WITHSCORES')
    if #top > 0 and tonumber(top[2]) <= st then  -- in order: everything goes
      redis.call('UNLINK', HELD[tier], ORDER[tier])
      pmax[tier] = -1
    elseif #top > 0 then  -- blocks of later batches already applied stay
      drop(tier, redis.call('ZRANGEBYSCORE', ORDER[tier], '-inf', fmt(st)))
    end
  end
  new_gen()
  c.clears = c.clears + 1
end

local function count_blocks(blob, pos, nev)
  local total = 0
  for _ = 1, nev do
    local _kind, _tier, n, nxt = struct.unpack('>BBI4', blob, pos)
    total = total + n
    pos = nxt + 8 * n
  end
  return total
end

local function apply_events(blob, base, nev, pos)
  local run_tier, run_h, run_st = nil, {}, {}
  for i = 0, nev - 1 do
    local kind, tier, n, nxt = struct.unpack('>BBI4', blob, pos)
    local st = base + i
    if run_tier and (kind ~= 2 or tier ~= run_tier) then
      remove(run_tier, run_h, run_st)
      run_tier, run_h, run_st = nil, {}, {}
    end
    if kind == 3 then
      clear(st)
    elseif st <= wm then
      c.stale = c.stale + n
    elseif kind == 1 then
      store(tier, blob, nxt, n, st)
    else
      run_tier = tier
      for _, h in ipairs(hashes(blob, nxt, n)) do
        run_h[#run_h + 1] = h
        run_st[#run_st + 1] = st
      end
    end
    pos = nxt + 8 * n
  end
  if run_tier then remove(run_tier, run_h, run_st) end
end

local function apply_part(blob)  -- a batch, or a part of a big one (`more` == 1 after the first)
  local bep = sub(blob, 1, 20)
  local base, nev, more, pos = struct.unpack('>dI4B', blob, 21)
  if ep and bep < ep then
    if more == 0 then c.stale_batches = c.stale_batches + 1 end
    c.stale = c.stale + count_blocks(blob, pos, nev)
    return false
  end
  if ep ~= bep then  -- first batch ever / after expiry, or a newer epoch: start wiped
    if not ep then
      -- nothing known of the backend (first batch ever, its keys expired, or Redis lost them):
      -- unless this part starts an epoch (AllCleared first), the index misses its history
      c.created = 1
      if more ~= 0 or nev == 0 or struct.unpack('>B', blob, pos) ~= 3 then c.gap = 1 end
    end
    redis.call('UNLINK', KEYS[2], KEYS[3], KEYS[4], KEYS[5], T0, T1)
    ep, wm, tmax, rot = bep, -1, -1, now_ms
    pmax[0], pmax[1] = -1, -1
    new_gen()
  end
  if now_ms - rot >= tomb_ms or redis.call('HLEN', T0) > 2 * maxb then
    redis.call('UNLINK', T1)
    if redis.call('EXISTS', T0) == 1 then redis.call('RENAME', T0, T1) end
    rot = now_ms
  end
  if more == 0 then c.batches = c.batches + 1 end
  apply_events(blob, base, nev, pos)
  flush_tombs()
  return true
end

local applied_any = false  -- a part that is not stale: refresh the liveness
for a = 4, #ARGV do
  if apply_part(ARGV[a]) then applied_any = true end
end
if not applied_any and c.stale == 0 then return {0, 0, 0, 0, 0, 0, 0, 0} end

local fields = {
  'c_batches', fmt((tonumber(m[6]) or 0) + c.batches), 'c_applied', fmt((tonumber(m[7]) or 0) + c.applied),
  'c_stale', fmt((tonumber(m[8]) or 0) + c.stale), 'c_stale_batches', fmt((tonumber(m[9]) or 0) + c.stale_batches),
  'c_clears', fmt((tonumber(m[10]) or 0) + c.clears), 'c_evicted', fmt((tonumber(m[11]) or 0) + c.evicted)}
if applied_any then
  for _, v in ipairs({'ep', ep, 'wm', fmt(wm), 'gen', fmt(gen), 'tmax', fmt(tmax), 'rot', fmt(rot),
                      'seen', fmt(now_ms), 'pg', fmt(pmax[0]), 'ps', fmt(pmax[1])}) do
    fields[#fields + 1] = v
  end
end
redis.call('HSET', M, unpack(fields))
if applied_any then
  for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, ttl_ms) end
end
return {c.batches, c.applied, c.stale, c.stale_batches, c.clears, c.evicted, c.created, c.gap}
"""

# KEYS: m, g, s.  ARGV[1]: the packed chain.  Returns {gpu, any, held, gen} (zeros for a
# backend without state: never seen, or expired). Walks the chain in chunks (HMGET of 8, then
# 32, 128, 256 blocks) and stops at the first block not held: exactly the leading run,
# whatever the shape of the holdings. The chunk sizes stay far below Lua's C-stack limit.
MATCH = r"""
local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then return {0, 0, 0, 0} end
local chain = ARGV[1]
local n = math.floor(#chain / 8)
local held = redis.call('HLEN', KEYS[2])
local C8 = {}

-- HMGET of the chain's blocks i..j, sliced in C by struct.unpack (its last value, the next
-- position, is looked up too as a field that cannot exist: a number, not 8 bytes)
local function lookup(key, i, j)
  local f = C8[j - i + 1]
  if not f then f = string.rep('c8', j - i + 1); C8[j - i + 1] = f end
  return redis.call('HMGET', key, struct.unpack(f, chain, 8 * i - 7))
end

-- leading blocks held in GPU memory
local gpu, i, step = n, 1, 8
while i <= n do
  local j = math.min(n, i + step - 1)
  local found = lookup(KEYS[2], i, j)
  local miss
  for k = 1, j - i + 1 do
    if not found[k] then miss = k; break end
  end
  if miss then gpu = i + miss - 2; break end
  i = j + 1
  if step < 256 then step = step * 4 end
end

-- then blocks held in GPU or storage (only when the backend has a storage tier)
local any = gpu
if gpu < n and redis.call('EXISTS', KEYS[3]) == 1 then
  any, i, step = n, gpu + 1, 8
  while i <= n do
    local j = math.min(n, i + step - 1)
    local stored = lookup(KEYS[3], i, j)
    local on_gpu, miss
    for k = 1, j - i + 1 do
      if not stored[k] then
        on_gpu = on_gpu or lookup(KEYS[2], i, j)
        if not on_gpu[k] then miss = k; break end
      end
    end
    if miss then any = i + miss - 2; break end
    i = j + 1
    if step < 256 then step = step * 4 end
  end
end
return {gpu, any, held, gen}
"""

# KEYS: m, g, s.  Returns false for a backend without state, else
# {gpu, storage, epoch, age_ms, gen, batches, applied, stale, stale_batches, clears, evicted}.
STATS = r"""
local v = redis.call('HMGET', KEYS[1], 'ep', 'seen', 'gen',
  'c_batches', 'c_applied', 'c_stale', 'c_stale_batches', 'c_clears', 'c_evicted')
if not v[3] then return false end
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local age = -1
if v[2] then age = math.max(0, now_ms - tonumber(v[2])) end
return {redis.call('HLEN', KEYS[2]), redis.call('HLEN', KEYS[3]), v[1] or '0', age, v[3],
  v[4] or '0', v[5] or '0', v[6] or '0', v[7] or '0', v[8] or '0', v[9] or '0'}
"""

# KEYS: all of a backend's.  Deletes its state; returns how many present blocks went.
CLEAR = r"""
local held = redis.call('HLEN', KEYS[2]) + redis.call('HLEN', KEYS[3])
redis.call('UNLINK', unpack(KEYS))
return held
"""
