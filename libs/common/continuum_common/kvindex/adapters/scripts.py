"""Lua scripts of RedisKvIndex. Every call names only keys of ONE cluster slot: the caller
groups prefixes by slot (on a single node, any prefixes may share a call; see keys.py).

APPLY mirrors continuum_common.kvindex.entry exactly, per prefix: the TTL check, the clear
watermark, the last-writer-wins field writes, then the holder sorted set, the warm set and the
TTLs, all in one atomic unit. Meta values are `<gpu stamp 40><warm stamp 40><gpu>:<warm>`.

Arguments are packed into one string per prefix (records `backend,stamp,watermark,gpu,warm`
joined by `;`): the Redis client spends microseconds per argument, and a batch has thousands.
"""

from __future__ import annotations

# KEYS: the holders zset (the contract key) of each prefix. Its warm set and meta hash are
#       derived here: they carry the holders key as their hash tag, so they are in its slot
#       by construction (Redis >= 7 checks that a script's undeclared keys share the slot
#       of its declared ones; fewer declared keys save the client thousands of arguments).
# ARGV: ttl_s, meta_ttl_s, tiers ('1' when warm copies are tracked), key prefix, then one
#       string per prefix: touch_us|record;record;...
#       record = backend,stamp,watermark,gpu,warm  (gpu/warm '' = leave; warm -2 = copy gpu)
# Returns one string: a digit per record, in order: applied (0/1) + 2 if the backend started
# holding the prefix, + 4 if it stopped.
APPLY = """
local NO_STAMP = string.rep('-', 40)
local ttl, meta_ttl, tiers, kp = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4]
local codes = {}
local function apply_prefix(K, W, M, touch, blob)
  if redis.call('EXISTS', K) == 0 then
    -- the holders expired (TTL) or never existed: keep the stamps, forget the holdings
    local all = redis.call('HGETALL', M)
    for j = 1, #all, 2 do
      local f, v = all[j], all[j + 1]
      if f ~= '~t' and string.sub(v, 81) ~= '-1:-1' then
        redis.call('HSET', M, f, string.sub(v, 1, 80) .. '-1:-1')
      end
    end
    if tiers and #all > 0 then redis.call('DEL', W) end
  end
  local dirty, any_applied = false, false
  local meta = {}  -- backend -> meta value written by this call (one HSET at the end)
  for rec in string.gmatch(blob, '[^;]+') do
    local b, st, wm, gv, wv = string.match(rec, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$')
    local gs, ws, gt, wt = NO_STAMP, NO_STAMP, -1, -1
    local raw = meta[b] or redis.call('HGET', M, b)
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
    if wv ~= '' and st > ws then
      local v = tonumber(wv)
      if v == -2 then
        if gt >= 0 then v = gt else v = wt end
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
      meta[b] = gs .. ws .. string.format('%d:%d', gt, wt)
      -- without tier tracking no warm value is ever written, so W stays empty
      if gt >= 0 then
        redis.call('ZADD', K, gt, b)
        if tiers then redis.call('SREM', W, b) end
      elseif wt >= 0 then
        redis.call('ZADD', K, wt, b)
        redis.call('SADD', W, b)
      else
        redis.call('ZREM', K, b)
        if tiers then redis.call('SREM', W, b) end
      end
      dirty = true
    end
    if applied == 1 then any_applied = true end
    codes[#codes + 1] = code
  end
  local fields = {}
  for b, value in pairs(meta) do
    fields[#fields + 1] = b
    fields[#fields + 1] = value
  end
  if any_applied then
    -- a write refreshes the prefix's TTL and its place in the LRU order
    fields[#fields + 1] = '~t'
    fields[#fields + 1] = touch
  end
  if #fields > 0 then redis.call('HSET', M, unpack(fields)) end
  if any_applied then
    redis.call('EXPIRE', K, ttl)
    if tiers then redis.call('EXPIRE', W, ttl) end
    redis.call('EXPIRE', M, meta_ttl)
  elseif dirty and tiers then
    -- only a clear watermark took effect: keep the TTL the last write gave the prefix
    local pt = redis.call('PTTL', K)
    if pt > 0 then redis.call('PEXPIRE', W, pt) end
  end
end
for p = 1, #KEYS do
  local K = KEYS[p]
  local touch, blob = string.match(ARGV[p + 4], '^(%d+)|(.*)$')
  apply_prefix(K, kp .. 'w:{' .. K .. '}', kp .. 'm:{' .. K .. '}', touch, blob)
end
return table.concat(codes)
"""

# KEYS: one sorted set. ARGV[1]: "score member,score member,..." — a variadic ZADD in one
# argument (the LRU order and the reverse indexes get a member per prefix of a batch).
ZADD_PACKED = """
local pairs_ = {}
for score, member in string.gmatch(ARGV[1], '(%d+) ([^,]+)') do
  pairs_[#pairs_ + 1] = score
  pairs_[#pairs_ + 1] = member
  if #pairs_ >= 1000 then
    redis.call('ZADD', KEYS[1], unpack(pairs_))
    pairs_ = {}
  end
end
if #pairs_ > 0 then redis.call('ZADD', KEYS[1], unpack(pairs_)) end
return redis.call('ZCARD', KEYS[1])
"""

# KEYS: per prefix holders zset, warm set, meta hash. ARGV: per prefix the LRU score the
# evictor saw. Deletes each prefix unless it was written after that score (a refresh wins).
# Returns how many prefixes were deleted.
EVICT = """
local evicted = 0
for p = 1, #KEYS / 3 do
  local t = redis.call('HGET', KEYS[3 * p], '~t')
  if not (t and tonumber(t) > tonumber(ARGV[p])) then
    if redis.call('DEL', KEYS[3 * p - 2], KEYS[3 * p - 1], KEYS[3 * p]) > 0 then evicted = evicted + 1 end
  end
end
return evicted
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

UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
