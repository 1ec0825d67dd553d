"""Lua scripts of RedisBlockIndex. Every call names the five keys of ONE backend (one cluster
slot: they share the hash tag `{backend}`, see ../block_keys.py); the batches and chains travel
packed (../block_pack.py), one argument each.

APPLY implements continuum_common.kvindex.blocks exactly as InMemoryBlockIndex does:

* a register's `(stamp, present)` is the newest of: its score in the tier's zset (present),
  its tombstone in t0 or t1 (absent); the clear watermark `wm` reads every register at or
  below it as absent (AllCleared removes those zset members at once: ZREMRANGEBYSCORE);
* a store is one `ZADD GT CH` per event for all its hashes (a member changes only when the
  stamp is newer; CH counts the applied ones). Tombstones are looked up only when the stamp is
  not newer than `tmax`, the newest tombstone stamp: in-order delivery never looks;
* a removal is one ZMSCORE, one ZREM per event; its tombstones are written once per batch
  (`pend`, consulted before t0/t1 so later events of the batch see them);
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

# KEYS: m, g, s, t0, t1.  ARGV: ttl_ms, max_blocks, tomb_ms, then one packed batch each.
# Returns {batches, applied, stale, stale_batches, clears, evicted}.
APPLY = r"""
local M, G, S, T0, T1 = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ttl_ms, maxb, tomb_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local CHUNK = 1000
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local m = redis.call('HMGET', M, 'ep', 'wm', 'gen', 'tmax', 'rot',
  'c_batches', 'c_applied', 'c_stale', 'c_stale_batches', 'c_clears', 'c_evicted')
local ep, wm, gen, tmax, rot = m[1], tonumber(m[2]) or -1, tonumber(m[3]) or 0, tonumber(m[4]) or -1,
  tonumber(m[5]) or now_ms
local c = {batches = 0, applied = 0, stale = 0, stale_batches = 0, clears = 0, evicted = 0}
local ZSET = {[0] = G, [1] = S}
local TAG = {[0] = 'g', [1] = 's'}
local pend = {}  -- tombstone field -> stamp, written to t0 at the end of each batch
local npend = 0

local function fmt(x) return string.format('%d', x) end
local function new_gen() gen = math.max(gen + 1, now_us) end

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
    if #args >= 2 * CHUNK then redis.call('HSET', T0, unpack(args)); args = {} end
  end
  if #args > 0 then redis.call('HSET', T0, unpack(args)) end
  pend, npend = {}, 0
end

local function zadd(key, args)
  return redis.call('ZADD', key, 'GT', 'CH', unpack(args))
end

local function store(tier, blob, pos, n, st)
  local key, tag = ZSET[tier], TAG[tier]
  local check, s = st <= tmax, fmt(st)
  local args, cand, changed = {}, 0, 0
  for k = 0, n - 1 do
    local h = string.sub(blob, pos + 8 * k, pos + 8 * k + 7)
    if check and tomb(tag .. h) >= st then
      c.stale = c.stale + 1
    else
      args[#args + 1] = s
      args[#args + 1] = h
      cand = cand + 1
      if #args >= 2 * CHUNK then changed = changed + zadd(key, args); args = {} end
    end
  end
  if #args > 0 then changed = changed + zadd(key, args) end
  c.applied = c.applied + changed
  c.stale = c.stale + cand - changed
  local over = redis.call('ZCARD', key) - maxb
  if over > 0 then
    local popped = redis.call('ZPOPMIN', key, over)
    for j = 1, #popped, 2 do put_tomb(tag .. popped[j], tonumber(popped[j + 1])) end
    c.evicted = c.evicted + #popped / 2
  end
end

-- hs[k] removed at stamp sts[k] (a run of consecutive removal events: vLLM sends one per
-- evicted block, so this is one ZMSCORE and one ZREM for the run, not per event)
local function remove(tier, hs, sts)
  local key, tag = ZSET[tier], TAG[tier]
  local n = #hs
  for first = 1, n, CHUNK do
    local last = math.min(n, first + CHUNK - 1)
    local scores = redis.call('ZMSCORE', key, unpack(hs, first, last))
    local gone = {}
    for k = first, last do
      local h, st, sc = hs[k], sts[k], scores[k - first + 1]
      local f = tag .. h
      local p = pend[f]
      if (p and p >= st) or (sc and tonumber(sc) >= st) or ((not sc) and st <= tmax and tomb(f) >= st) then
        c.stale = c.stale + 1
      else
        if sc then gone[#gone + 1] = h end
        put_tomb(f, st)
        c.applied = c.applied + 1
      end
    end
    if #gone > 0 then redis.call('ZREM', key, unpack(gone)) end
  end
end

local function clear(st)
  if st <= wm then return end
  wm = st
  redis.call('ZREMRANGEBYSCORE', G, '-inf', fmt(st))
  redis.call('ZREMRANGEBYSCORE', S, '-inf', fmt(st))
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

local function apply_batch(blob)
  local bep = string.sub(blob, 1, 20)
  local base, nev, pos = struct.unpack('>dI4', blob, 21)
  if ep and bep < ep then
    c.stale_batches = c.stale_batches + 1
    c.stale = c.stale + count_blocks(blob, pos, nev)
    return
  end
  if ep ~= bep then  -- first batch ever / after expiry, or a newer epoch: start wiped
    redis.call('UNLINK', G, S, T0, T1)
    ep, wm, tmax, rot = bep, -1, -1, now_ms
    new_gen()
  end
  if now_ms - rot >= tomb_ms or redis.call('HLEN', T0) > 2 * maxb then
    redis.call('UNLINK', T1)
    if redis.call('EXISTS', T0) == 1 then redis.call('RENAME', T0, T1) end
    rot = now_ms
  end
  c.batches = c.batches + 1
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
      for k = 0, n - 1 do
        run_h[#run_h + 1] = string.sub(blob, nxt + 8 * k, nxt + 8 * k + 7)
        run_st[#run_st + 1] = st
      end
    end
    pos = nxt + 8 * n
  end
  if run_tier then remove(run_tier, run_h, run_st) end
  flush_tombs()
end

for a = 4, #ARGV do apply_batch(ARGV[a]) end
if c.batches == 0 and c.stale_batches == 0 then return {0, 0, 0, 0, 0, 0} end

local fields = {
  'c_batches', fmt((tonumber(m[6]) or 0) + c.batches), 'c_applied', fmt((tonumber(m[7]) or 0) + c.applied),
  'c_stale', fmt((tonumber(m[8]) or 0) + c.stale), 'c_stale_batches', fmt((tonumber(m[9]) or 0) + c.stale_batches),
  'c_clears', fmt((tonumber(m[10]) or 0) + c.clears), 'c_evicted', fmt((tonumber(m[11]) or 0) + c.evicted)}
if c.batches > 0 then
  for _, v in ipairs({'ep', ep, 'wm', fmt(wm), 'gen', fmt(gen), 'tmax', fmt(tmax), 'rot', fmt(rot),
                      'seen', fmt(now_ms)}) do fields[#fields + 1] = v end
end
redis.call('HSET', M, unpack(fields))
if c.batches > 0 then
  for _, k in ipairs({M, G, S, T0, T1}) do redis.call('PEXPIRE', k, ttl_ms) end
end
return {c.batches, c.applied, c.stale, c.stale_batches, c.clears, c.evicted}
"""

# KEYS: m, g, s.  ARGV[1]: the packed chain.  Returns {gpu, any, held, gen} (zeros for a
# backend without state: never seen, or expired). Walks the chain in chunks (ZMSCORE of 8,
# then 32, 128, 256 hashes) and stops at the first block not held: exactly the leading run,
# whatever the shape of the holdings.
MATCH = r"""
local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then return {0, 0, 0, 0} end
local chain = ARGV[1]
local n = math.floor(#chain / 8)
local held = redis.call('ZCARD', KEYS[2])

local function hashes(i, j)
  local t = {}
  for k = i, j do t[#t + 1] = string.sub(chain, 8 * k - 7, 8 * k) end
  return t
end

-- leading blocks held in GPU memory
local gpu, i, step = n, 1, 8
while i <= n do
  local j = math.min(n, i + step - 1)
  local scores = redis.call('ZMSCORE', KEYS[2], unpack(hashes(i, j)))
  local miss
  for k = 1, #scores do
    if not scores[k] then miss = k; break end
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
    local hs = hashes(i, j)
    local stored = redis.call('ZMSCORE', KEYS[3], unpack(hs))
    local on_gpu, miss
    for k = 1, #stored do
      if not stored[k] then
        on_gpu = on_gpu or redis.call('ZMSCORE', KEYS[2], unpack(hs))
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
return {redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]), v[1] or '0', age, v[3],
  v[4] or '0', v[5] or '0', v[6] or '0', v[7] or '0', v[8] or '0', v[9] or '0'}
"""

# KEYS: m, g, s, t0, t1.  Deletes the backend's state; returns how many present blocks went.
CLEAR = r"""
local held = redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return held
"""
