-- Prefix completion by score, outside automatic mode: the fast path of complete.lua for it (the
-- same results and reply, with a smaller script). Reads only (flags=no-writes).
--
-- KEYS[1] the lex set of the query's first byte   KEYS[2] data   KEYS[3] heavy   (as in add.lua;
--         the features hash, <base>:f, is derived like the sets: declaring a key that may not
--         exist would have a Cluster refuse the read while the slot migrates)
-- ARGV[1] base (as in add.lua)   ARGV[2] limit   ARGV[3] the normalized query
-- ARGV[4] where the previous page stopped, exclusive: '' or a ranked member
-- ARGV[5] max depth, ARGV[6] heavy, ARGV[7] budget (as in complete.lua)
--
-- Returns {1 when there may be more (else 0), the next position, then per result: id, data
-- value, match kind (EXACT or PREFIX)}, or {-1, 'r', ''} when the dictionary has no ranked sets
-- (features.lua).
--
-- The results are read by best_of (best.lua), looking at no more than `budget` entries in all.
local lex, data, heavy_set = KEYS[1], KEYS[2], KEYS[3]
if not has_feature(features_of(ARGV[1] .. ':f'), 'r') then
  return refusal(ARGV[1] .. ':f', 'r')
end
local base, need, q, pos = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local depth, heavy, budget = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])

local rows, stopped = best_of(base, lex, data, heavy_set, q, need, pos, depth, heavy, budget, nil)

local reply = { 0, '' }
if #rows > need then
  reply[1], reply[2] = 1, rows[need]
elseif stopped then
  reply[1], reply[2] = 1, stopped
end
local ids, kinds = {}, {}
for i = 1, math.min(#rows, need) do
  local m = rows[i]
  local j = find(m, '\0', 9, true)
  ids[i] = sub(m, j + 1)
  kinds[i] = j == 9 + #q and 1 or 2
end
if #ids > 0 then
  local values = redis.call('HMGET', data, unpack(ids))
  for i = 1, #ids do
    reply[#reply + 1] = ids[i]
    reply[#reply + 1] = values[i]
    reply[#reply + 1] = kinds[i]
  end
end
return reply
