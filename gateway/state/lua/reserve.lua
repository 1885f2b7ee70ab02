-- KEYS: K, K..':e' per claim, then per stamp, then one text key per read.
-- ARGV: id, lease_ms, #claims, #reads, then per claim amount, limit, ttl_ms,
-- window_ms, then per stamp value, ttl_ms, only_if_absent (1/0), then per
-- read its refresh ttl_ms; -1 means none.
-- Returns {1, now_ms, 0, 0, -1, stamps..., texts...} or {0, now_ms, failed
-- claim (1-based), current, retry_ms or -1, stamps..., texts...}; a missing
-- text is nil.
local entry = 'r:' .. ARGV[1]
local lease = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local reads = tonumber(ARGV[4])
local pairs_n = (#KEYS - reads) / 2
local failed, current, retry = 0, 0, -1
local bases, expiries = {}, {}
for i = 1, n do
  local k, e, a = KEYS[2 * i - 1], KEYS[2 * i], 5 + 4 * (i - 1)
  local b, x, l = prune(k, e, nil)
  bases[i], expiries[i] = b, x
  local amount, limit = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  if failed == 0 and limit >= 0 and amount > 0 then
    local cur = (tonumber(b) or 0) + l
    if cur + amount > limit then
      failed, current = i, cur
      if tonumber(ARGV[a + 3]) >= 0 and amount <= limit then
        retry = retry_after(k, e, cur + amount - limit)
      end
    end
  end
end
local out, stamped = {}, {}
for j = 1, pairs_n - n do
  local k, e, a = KEYS[2 * (n + j) - 1], KEYS[2 * (n + j)], 5 + 4 * n + 3 * (j - 1)
  stamped[k] = true
  local b, x = prune(k, e, nil)
  if not (ARGV[a + 2] == '1' and b) then
    b = ARGV[a]
    redis.call('HSET', k, 'b', b)
  end
  local ttl = tonumber(ARGV[a + 1])
  if ttl >= 0 then
    x = NOW + ttl
    redis.call('HSET', k, 'x', x)
  else
    x = nil
    redis.call('HDEL', k, 'x')
  end
  expire_as_held(k, e, b, x)
  out[j] = tonumber(b)
end
local first_read = 5 + 4 * n + 3 * (pairs_n - n)
for j = 1, reads do
  local k, ttl = KEYS[2 * pairs_n + j], tonumber(ARGV[first_read + j - 1])
  local text = redis.call('GET', k)
  if text and ttl >= 0 then redis.call('PEXPIRE', k, math.max(ttl, 1)) end
  out[pairs_n - n + j] = text
end
if failed > 0 then return {0, NOW, failed, current, retry, unpack(out, 1, pairs_n - n + reads)} end
for i = 1, n do
  local k, e, a = KEYS[2 * i - 1], KEYS[2 * i], 5 + 4 * (i - 1)
  local amount = tonumber(ARGV[a])
  redis.call('HINCRBY', k, entry, amount)
  if amount ~= 0 then redis.call('HINCRBY', k, 'l', amount) end
  redis.call('ZADD', e, NOW + lease, entry)
  local ttl = tonumber(ARGV[a + 2])
  refresh(k, ttl)
  if stamped[k] then
    touch(k, e)  -- a stamp changed its base
  else
    expire_as_held(k, e, bases[i], ttl >= 0 and NOW + ttl or expiries[i])
  end
end
return {1, NOW, 0, 0, -1, unpack(out, 1, pairs_n - n + reads)}
