-- Prefix completion in lexicographic order, outside automatic mode: the most common query, and
-- the fast path of complete.lua (same arguments in short, same reply). Reads only
-- (flags=no-writes).
--
-- KEYS[1] the lex set of the query's first byte   KEYS[2] data   (as in add.lua)
-- ARGV[1] limit   ARGV[2] the normalized query
-- ARGV[3] where the previous page stopped: '' or a lex member, exclusive
--
-- Returns {1 when there is more (else 0), the next position, then per result: id, data value,
-- match kind (EXACT or PREFIX)}.
local need, q, pos = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local lo = pos ~= '' and '(' .. pos or '[' .. q
local rows = redis.call('ZRANGE', KEYS[1], lo, '(' .. q .. '\255', 'BYLEX', 'LIMIT', 0, need + 1)
local reply = { 0, '' }
if #rows > need then
  reply[1], reply[2] = 1, rows[need]
end
local ids, kinds = {}, {}
for i = 1, math.min(#rows, need) do
  local m = rows[i]
  -- A position from a forged token could lie before the prefix's range.
  if string.sub(m, 1, #q) == q then
    local j = string.find(m, '\0', 1, true)
    ids[#ids + 1] = string.sub(m, j + 1)
    kinds[#kinds + 1] = j == #q + 1 and 1 or 2
  end
end
if #ids > 0 then
  local values = redis.call('HMGET', KEYS[2], unpack(ids))
  for i = 1, #ids do
    reply[#reply + 1] = ids[i]
    reply[#reply + 1] = values[i]
    reply[#reply + 1] = kinds[i]
  end
end
return reply
