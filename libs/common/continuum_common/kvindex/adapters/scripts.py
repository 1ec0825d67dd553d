"""Lua scripts of RedisKvIndex. Each touches only keys of one cluster slot (see keys.py).

APPLY mirrors continuum_common.kvindex.entry exactly: the clear watermark first, then the
last-writer-wins field writes, then the holder sorted set, the warm set and the TTLs, all in
one atomic unit. Meta values are `<gpu stamp 40><warm stamp 40><gpu tokens>:<warm tokens>`.
"""

from __future__ import annotations

# KEYS: holders zset, warm set, meta hash
# ARGV: ttl_s, meta_ttl_s, touch_us, n, then n records of
#       backend, stamp, watermark, gpu value ('' = leave), warm value ('' = leave; -2 = copy gpu)
# Returns one code per record: applied (0/1) + 2 if the backend started holding, + 4 if it stopped.
APPLY = """
local K, W, M = KEYS[1], KEYS[2], KEYS[3]
local NO_STAMP = string.rep('-', 40)
if redis.call('EXISTS', K) == 0 then
  -- the holders expired (TTL) or never existed: keep the stamps, forget the holdings
  local all = redis.call('HGETALL', M)
  for j = 1, #all, 2 do
    local f, v = all[j], all[j + 1]
    if f ~= '~t' and string.sub(v, 81) ~= '-1:-1' then
      redis.call('HSET', M, f, string.sub(v, 1, 80) .. '-1:-1')
    end
  end
  redis.call('DEL', W)
end
local n = tonumber(ARGV[4])
local out = {}
local dirty = false
local any_applied = false
local i = 4
for r = 1, n do
  local b, st, wm, gv, wv = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  i = i + 5
  local gs, ws, gt, wt = NO_STAMP, NO_STAMP, -1, -1
  local raw = redis.call('HGET', M, b)
  if raw then
    gs = string.sub(raw, 1, 40)
    ws = string.sub(raw, 41, 80)
    local sep = string.find(raw, ':', 81, true)
    gt = tonumber(string.sub(raw, 81, sep - 1))
    wt = tonumber(string.sub(raw, sep + 1))
  end
  local gt0, wt0 = gt, wt
  local held_before = gt >= 0 or wt >= 0
  if wm > gs then gs = wm; gt = -1 end
  if wm > ws then ws = wm; wt = -1 end
  local applied = 0
  local g0 = gt
  if wv ~= '' and st > ws then
    local v = tonumber(wv)
    if v == -2 then
      if g0 >= 0 then v = g0 else v = wt end
    end
    ws = st; wt = v; applied = 1
  end
  if gv ~= '' and st > gs then
    gs = st; gt = tonumber(gv); applied = 1
  end
  local held_after = gt >= 0 or wt >= 0
  local code = applied
  if held_after and not held_before then code = code + 2 end
  if held_before and not held_after then code = code + 4 end
  if applied == 1 or gt ~= gt0 or wt ~= wt0 then
    redis.call('HSET', M, b, gs .. ws .. string.format('%d:%d', gt, wt))
    if gt >= 0 then
      redis.call('ZADD', K, gt, b)
      redis.call('SREM', W, b)
    elseif wt >= 0 then
      redis.call('ZADD', K, wt, b)
      redis.call('SADD', W, b)
    else
      redis.call('ZREM', K, b)
      redis.call('SREM', W, b)
    end
    dirty = true
  end
  if applied == 1 then any_applied = true end
  out[r] = code
end
if any_applied then
  -- a write refreshes the prefix's TTL and its place in the LRU order
  redis.call('HSET', M, '~t', ARGV[3])
  redis.call('EXPIRE', K, ARGV[1])
  redis.call('EXPIRE', W, ARGV[1])
  redis.call('EXPIRE', M, ARGV[2])
elseif dirty then
  -- only a clear watermark took effect: keep the TTL the last write gave the prefix
  local pt = redis.call('PTTL', K)
  if pt > 0 then redis.call('PEXPIRE', W, pt) end
end
return out
"""

# KEYS: holders zset, warm set, meta hash. ARGV: the LRU score the evictor saw.
# Deletes the prefix unless it was written after that score (a concurrent refresh wins).
EVICT = """
local t = redis.call('HGET', KEYS[3], '~t')
if t and tonumber(t) > tonumber(ARGV[1]) then return 0 end
return redis.call('DEL', KEYS[1], KEYS[2], KEYS[3]) > 0 and 1 or 0
"""

# KEYS: the LRU zset. ARGV: member, score pairs. Removes members not refreshed since.
LRU_FORGET = """
local removed = 0
for j = 1, #ARGV, 2 do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[j])
  if s and tonumber(s) <= tonumber(ARGV[j + 1]) then
    redis.call('ZREM', KEYS[1], ARGV[j])
    removed = removed + 1
  end
end
return removed
"""

# KEYS: a backend's watermark. ARGV: a stamp. Raises the watermark, returns the effective one.
RAISE_WATERMARK = """
local c = redis.call('GET', KEYS[1])
if (not c) or ARGV[1] > c then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return c
"""
