-- List: one page of a recent list, most recent first. Reads only (flags=no-writes).
--
-- KEYS[1] order   KEYS[2] items   (as in recent_record.lua)
-- ARGV[1] limit   ARGV[2] where the previous page stopped: '' or a recorded-at time, exclusive
--
-- Returns {more (0 or 1), then per item: id, recorded at (as text), item value}.
local limit, pos = tonumber(ARGV[1]), ARGV[2]
local top = pos == '' and '+inf' or '(' .. pos
local rows = redis.call('ZREVRANGEBYSCORE', KEYS[1], top, '-inf', 'WITHSCORES', 'LIMIT', 0, limit + 1)
local n = math.min(#rows / 2, limit)
local reply = { #rows / 2 > limit and 1 or 0 }
if n == 0 then
  return reply
end
local ids = {}
for i = 1, n do
  ids[i] = rows[2 * i - 1]
end
local values = redis.call('HMGET', KEYS[2], unpack(ids))
for i = 1, n do
  reply[#reply + 1] = ids[i]
  reply[#reply + 1] = rows[2 * i]
  reply[#reply + 1] = values[i]
end
return reply
