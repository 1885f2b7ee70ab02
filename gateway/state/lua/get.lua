-- KEYS: K, K..':e' per counter. Returns each counter's value (b + l).
local out = {}
for i = 1, #KEYS / 2 do
  local b, _x, l = prune(KEYS[2 * i - 1], KEYS[2 * i], nil)
  out[i] = (tonumber(b) or 0) + l
end
return out
