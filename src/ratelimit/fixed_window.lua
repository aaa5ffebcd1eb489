-- Fixed window, as the classic INCR + EXPIRE limiter: the first allowed hit opens a window of
-- `period`, and the counter counts hits until the key expires with the window. Timing is Redis's
-- own key expiry. Unlike the classic script, a denied hit counts nothing, and a counter found
-- without an expiry (written by something else, or left by an older script) gets the window's
-- expiry on whatever path finds it, a denied check or a peek included: without one it would
-- deny forever.
--
-- KEYS[1] string: the window's counter; expires at the window's end
-- ARGV[1] limit   ARGV[2] period ms   ARGV[3] cost (0 peeks)
-- ARGV[4] not after: the Redis time (us) past which the check changes nothing (0: none)
--
-- Returns {allowed (0/1; 2: too late), remaining, retry after us, reset after us, Redis time
-- us}. A peek (cost 0) writes nothing but that missing expiry, and answers whether a cost of 1
-- would be allowed now.
local key = KEYS[1]
local limit, period, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local not_after = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Too late: the caller was answered without this check (by the failure mode), so it changes
-- nothing.
if not_after > 0 and now > not_after then
  return {2, 0, 0, 0, now}
end

local stored = redis.call('GET', key)
local count = tonumber(stored or '0')
local ttl = 0
if stored then
  -- PTTL counts whole milliseconds left, rounded down: the window may last up to one more.
  ttl = redis.call('PTTL', key) + 1
  if ttl < 1 then
    redis.call('PEXPIRE', key, period)
    ttl = period
  end
end

local n = cost
if cost == 0 then
  n = 1
end
if count + n > limit then
  return {0, math.max(0, limit - count), ttl * 1000, ttl * 1000, now}
end
if cost == 0 then
  return {1, limit - count, 0, ttl * 1000, now}
end
count = redis.call('INCRBY', key, cost)
if not stored then
  redis.call('PEXPIRE', key, period)
  ttl = period
end
return {1, limit - count, 0, ttl * 1000, now}
