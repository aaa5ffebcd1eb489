-- GCRA (generic cell rate algorithm): a token bucket kept as one timestamp, the theoretical
-- arrival time (TAT) of the next unit at the sustained rate. A unit may go when the TAT, after
-- adding it, is at most `burst` intervals ahead of now.
--
-- KEYS[1] string "<whole us> <fraction of a us>": the TAT since the Unix epoch; expires when the
--         bucket is full again
-- ARGV[1] period us   ARGV[2] limit (units per period)   ARGV[3] burst   ARGV[4] cost (0 peeks)
-- ARGV[5] not after: the Redis time (us) past which the check changes nothing (0: none)
--
-- Returns {allowed (0/1; 2: too late), remaining, retry after us, reset after us, Redis time
-- us}. A peek (cost 0) writes nothing and answers whether a cost of 1 would be allowed now.
--
-- The arithmetic is done on the TAT's distance from now, which is at most `burst` intervals, so
-- doubles keep it to about 1e-15 of the bucket's size however small the interval: a unit of a
-- billion per second still counts. The caller bounds the bucket (`burst` intervals) to 100 years,
-- so the stored TAT stays an exact integer of microseconds and its expiry within PX's range.
local key = KEYS[1]
local period, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local not_after = tonumber(ARGV[5])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Too late: the caller was answered without this check (by the failure mode), so it changes
-- nothing.
if not_after > 0 and now > not_after then
  return {2, 0, 0, 0, now}
end
local interval = period / limit
local capacity = burst * interval

-- ahead: how far the TAT is ahead of now (0 when the bucket is full).
local ahead = 0
local stored = redis.call('GET', key)
if stored then
  local whole, fraction = string.match(stored, '^(%-?%d+) (%S+)$')
  if whole then
    ahead = math.max(0, (tonumber(whole) - now) + tonumber(fraction))
  end
end

-- Whole units in `span`, with room for the rounding of the division alone (a few parts in 1e16
-- of the bucket's units), never for time: a unit due in a second is not counted as there.
local eps = math.max(1e-9, burst * 1e-15)
local function units(span)
  return math.max(0, math.floor(span / interval + eps))
end

local n = cost
if cost == 0 then
  n = 1
end
local after = ahead + n * interval
local wait = after - capacity
-- No tolerance: a unit whose rounding puts it a hair past the bucket waits a microsecond more,
-- rather than any unit going before it is due.
if wait > 0 then
  -- More than the burst is never allowed (-1); the wait is then not a time and could be beyond
  -- what a Redis integer reply holds.
  local retry = -1
  if n <= burst then
    retry = math.ceil(wait)
  end
  return {0, units(capacity - ahead), retry, math.ceil(ahead), now}
end
if cost == 0 then
  return {1, units(capacity - ahead), 0, math.ceil(ahead), now}
end
local whole = math.floor(after)
redis.call('SET', key, string.format('%.0f %.17g', now + whole, after - whole),
  'PX', math.max(1, math.ceil(after / 1000)))
return {1, units(capacity - after), 0, math.ceil(after), now}
