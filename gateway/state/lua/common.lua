-- Shared by every script (prepended by gateway/state/redis.py).
-- A counter K is a hash: `b` the base (settled amounts and put values), `x`
-- when `b` expires (ms), `l` the sum of the entries, and one field per entry
-- (`r:<reservation id>` a live reservation's amount, `w:<ms>` settled window
-- amounts dropping out at that time). The sorted set K..':e' maps each entry
-- to when it ends (ms). A counter's value is b + l.
local t = redis.call('TIME')
local NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local PRUNE_BATCH = 256
local RETRY_SCAN = 512
local WINDOW_SLOTS = 50

-- Drop entries whose time has come (a bounded batch) and an expired base.
-- Returns what the counter holds then: its base `b` (nil: none), when the
-- base expires `x` (nil: never), the entries' sum `l`, and the amount of
-- entry `f` (nil: none; pass nil for no entry).
local function prune(k, e, f)
  local gone = redis.call('ZRANGEBYSCORE', e, '-inf', NOW, 'LIMIT', 0, PRUNE_BATCH)
  if #gone > 0 then
    local amounts = redis.call('HMGET', k, unpack(gone))
    local sum = 0
    for i = 1, #gone do sum = sum + (tonumber(amounts[i]) or 0) end
    redis.call('HDEL', k, unpack(gone))
    redis.call('ZREM', e, unpack(gone))
    if sum ~= 0 then redis.call('HINCRBY', k, 'l', -sum) end
  end
  local v = redis.call('HMGET', k, 'b', 'x', 'l', f or 'b')
  local b, x = v[1], tonumber(v[2])
  if x and x <= NOW then
    redis.call('HDEL', k, 'b', 'x')
    b, x = false, nil
  end
  return b, x, tonumber(v[3]) or 0, f and tonumber(v[4]) or nil
end

-- After a change, knowing the base `b` (false or nil: none) and when it
-- expires `x`: drop a counter that holds nothing, else make both keys live
-- as long as what they hold (the base until `x`, entries until they end).
local function expire_as_held(k, e, b, x)
  local last = redis.call('ZRANGE', e, -1, -1, 'WITHSCORES')
  local ends = tonumber(last[2])
  if not ends and not b then
    redis.call('DEL', k)
    return
  end
  -- Both keys expire together: entries must never outlive their amounts' sum
  -- in `l`, nor the other way round.
  if b and not x then
    redis.call('PERSIST', k)
    redis.call('PERSIST', e)
  else
    local at = math.max(x or 0, ends or 0)
    redis.call('PEXPIREAT', k, at)
    if ends then redis.call('PEXPIREAT', e, at) end
  end
end

-- The same, reading the base and its expiry first.
local function touch(k, e)
  local v = redis.call('HMGET', k, 'b', 'x')
  expire_as_held(k, e, v[1], tonumber(v[2]))
end

local function refresh(k, ttl)
  if ttl >= 0 then redis.call('HSET', k, 'x', NOW + ttl) end
end

-- Milliseconds until `need` of the settled window amounts has dropped out;
-- if they are not enough (live reservations hold the rest), until the first
-- drops out; -1 when none will.
local function retry_after(k, e, need)
  local dropped, first, start = 0, nil, 0
  while start < RETRY_SCAN do
    local page = redis.call('ZRANGE', e, start, start + 63, 'WITHSCORES')
    if #page == 0 then break end
    for p = 1, #page, 2 do
      local f = page[p]
      if string.sub(f, 1, 2) == 'w:' then
        local at = tonumber(page[p + 1])
        first = first or at
        dropped = dropped + (tonumber(redis.call('HGET', k, f)) or 0)
        if dropped >= need then return math.max(at - NOW, 0) end
      end
    end
    start = start + 64
  end
  if first then return math.max(first - NOW, 0) end
  return -1
end
