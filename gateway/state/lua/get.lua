-- KEYS: K, K..':e' per counter. Returns each counter's value (b + l).
local out = {}
for i = 1, #KEYS / 2 do
  prune(KEYS[2 * i - 1], KEYS[2 * i])
  out[i] = value(KEYS[2 * i - 1])
end
return out
