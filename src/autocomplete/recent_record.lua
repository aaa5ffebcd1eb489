-- Record: put an item at the front of a recent list and drop the oldest beyond the cap.
--
-- KEYS[1] order  sorted set: id -> when it was last recorded (microseconds, Redis clock, made
--                strictly increasing within the list so that the order is total)
-- KEYS[2] items  hash: id -> "<key>\0<display, '' when equal to id>\0<payload>"
-- ARGV[1] id (display text in NFC)   ARGV[2] key (normalized matching form)
-- ARGV[3] display ('' when equal to id)   ARGV[4] payload ('' keep, or 'p' .. payload)
-- ARGV[5] most items kept   ARGV[6] ttl of both keys (ms)
--
-- Returns {size, evicted, recorded at (microseconds, as text)}.
local order, items = KEYS[1], KEYS[2]
local id, key, display, payload = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local max_items, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local newest = redis.call('ZREVRANGE', order, 0, 0, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) >= now then
  now = tonumber(newest[2]) + 1
end
local stamp = string.format('%.0f', now)

if payload == '' then
  local old = redis.call('HGET', items, id)
  if old then
    local a = string.find(old, '\0', 1, true)
    payload = string.sub(old, string.find(old, '\0', a + 1, true) + 1)
  end
else
  payload = string.sub(payload, 2)
end
redis.call('HSET', items, id, key .. '\0' .. display .. '\0' .. payload)
redis.call('ZADD', order, stamp, id)

local size, evicted = redis.call('ZCARD', order), 0
if size > max_items then
  local gone = redis.call('ZRANGE', order, 0, size - max_items - 1)
  redis.call('ZREMRANGEBYRANK', order, 0, size - max_items - 1)
  redis.call('HDEL', items, unpack(gone))
  evicted, size = #gone, max_items
end
redis.call('PEXPIRE', order, ttl)
redis.call('PEXPIRE', items, ttl)
return { size, evicted, stamp }
