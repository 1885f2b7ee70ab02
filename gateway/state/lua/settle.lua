-- KEYS: K, K..':e' per claim, then one text key per write. ARGV: id, at_ms,
-- #claims, then per claim keep, ttl_ms, window_ms (-1: none), then per write
-- value, ttl_ms. A claim whose entry is gone (settled, released or expired)
-- is left alone: settling is idempotent. The writes are applied either way.
local entry = 'r:' .. ARGV[1]
local at = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
for j = 1, #KEYS - 2 * n do
  local a = 4 + 3 * n + 2 * (j - 1)
  redis.call('SET', KEYS[2 * n + j], ARGV[a], 'PX', math.max(tonumber(ARGV[a + 1]), 1))
end
for i = 1, n do
  local k, e, a = KEYS[2 * i - 1], KEYS[2 * i], 4 + 3 * (i - 1)
  local keep, ttl, window = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local b, x, _l, held = prune(k, e, entry)
  if held then
    redis.call('HDEL', k, entry)
    redis.call('ZREM', e, entry)
    local back = -held
    if keep > 0 and window < 0 then
      b = redis.call('HINCRBY', k, 'b', keep)
    elseif keep > 0 then
      local slot = window / WINDOW_SLOTS
      local drop = math.ceil(math.ceil((at + window) / slot) * slot)
      if drop > NOW then
        local f = 'w:' .. string.format('%d', drop)
        redis.call('HINCRBY', k, f, keep)
        redis.call('ZADD', e, drop, f)
        back = back + keep
      end
    end
    if back ~= 0 then redis.call('HINCRBY', k, 'l', back) end
    refresh(k, ttl)
    expire_as_held(k, e, b, ttl >= 0 and NOW + ttl or x)
  end
end
return 1
