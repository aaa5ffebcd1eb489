-- Fixed window, as the classic INCR + EXPIRE limiter: the first allowed hit opens a window of
-- `period`, and the counter counts hits until the key expires with the window. Timing is Redis's
-- own key expiry. Unlike the classic script, a denied hit counts nothing, and a counter found
-- without an expiry (written by something else, or left by an older script) gets the window's
-- expiry on whatever path finds it, a denied check or a peek included: without one it would
-- deny forever.
--
-- KEYS[1] string: the window's counter; expires at the window's end
-- ARGV[1] limit   ARGV[2] period ms   ARGV[3] cost (0 peeks)
--
-- Returns {allowed (0/1), remaining, retry after us, reset after us}. A peek (cost 0) writes
-- nothing but that missing expiry, and answers whether a cost of 1 would be allowed now.
local key = KEYS[1]
local limit, period, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local stored = redis.call('GET', key)
local count = tonumber(stored or '0')
local ttl = 0
if stored then
  ttl = redis.call('PTTL', key)
  if ttl < 0 then
    redis.call('PEXPIRE', key, period)
    ttl = period
  end
end

local n = cost
if cost == 0 then
  n = 1
end
if count + n > limit then
  return {0, math.max(0, limit - count), ttl * 1000, ttl * 1000}
end
if cost == 0 then
  return {1, limit - count, 0, ttl * 1000}
end
count = redis.call('INCRBY', key, cost)
if not stored then
  redis.call('PEXPIRE', key, period)
  ttl = period
end
return {1, limit - count, 0, ttl * 1000}
