-- Renews a batch of reservations. KEYS: K, K..':e' per claim of each in turn.
-- ARGV: per reservation id, #claims, lease_ms. Returns 1 (alive) or 0 each.
local out, key, arg = {}, 1, 1
while arg <= #ARGV do
  local entry, n = 'r:' .. ARGV[arg], tonumber(ARGV[arg + 1])
  local ends = NOW + tonumber(ARGV[arg + 2])
  local alive = 1
  for i = 0, n - 1 do
    local k, e = KEYS[key + 2 * i], KEYS[key + 2 * i + 1]
    local t = tonumber(redis.call('ZSCORE', e, entry))
    if t and t > NOW then
      redis.call('ZADD', e, 'XX', ends, entry)
      touch(k, e)
    else
      alive = 0
    end
  end
  out[#out + 1] = alive
  key, arg = key + 2 * n, arg + 3
end
return out
