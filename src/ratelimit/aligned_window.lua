-- Fixed window aligned to the clock, as envoyproxy/ratelimit counts: windows are the multiples of
-- `period` since the Unix epoch by Redis TIME (a per-minute limit resets at every full minute).
--
-- KEYS[1] hash: w = the window's start (ms since the epoch), n = units counted in it; expires at
--         the window's end
-- ARGV[1] limit   ARGV[2] period ms   ARGV[3] cost (0 peeks)
-- ARGV[4] not after: the Redis time (us) past which the check changes nothing (0: none)
--
-- Returns {allowed (0/1; 2: too late), remaining, retry after us, reset after us, Redis time
-- us}. A peek (cost 0) writes nothing and answers whether a cost of 1 would be allowed now.
local key = KEYS[1]
local limit, period, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local not_after = tonumber(ARGV[4])

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Too late: the caller was answered without this check (by the failure mode), so it changes
-- nothing.
if not_after > 0 and now_us > not_after then
  return {2, 0, 0, 0, now_us}
end
local now_ms = math.floor(now_us / 1000)
local start = now_ms - (now_ms % period)
local finish = start + period
local until_end = finish * 1000 - now_us

local state = redis.call('HMGET', key, 'w', 'n')
local count = 0
if tonumber(state[1]) == start then
  count = tonumber(state[2]) or 0
end

local n = cost
if cost == 0 then
  n = 1
end
if count + n > limit then
  return {0, math.max(0, limit - count), until_end, until_end, now_us}
end
if cost == 0 then
  local reset = 0
  if count > 0 then
    reset = until_end
  end
  return {1, limit - count, 0, reset, now_us}
end
count = count + cost
redis.call('HSET', key, 'w', string.format('%.0f', start), 'n', string.format('%.0f', count))
redis.call('PEXPIREAT', key, string.format('%.0f', finish))
return {1, limit - count, 0, until_end, now_us}
