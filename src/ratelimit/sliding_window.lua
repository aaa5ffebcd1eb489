-- Exact sliding window: one sorted-set member per unit allowed, scored by the time it was allowed.
-- A unit counts while it is younger than `period`, so at most `limit` units are allowed in any
-- interval of length `period`.
--
-- KEYS[1] sorted set: member "<us>:<n>" scored by the microsecond it was allowed; expires
--         `period` after the last allowed unit
-- ARGV[1] limit   ARGV[2] period us   ARGV[3] period ms   ARGV[4] cost (0 peeks)
-- ARGV[5] not after: the Redis time (us) past which the check changes nothing (0: none)
--
-- Returns {allowed (0/1; 2: too late), remaining, retry after us, reset after us, Redis time
-- us}. A peek (cost 0) writes nothing and answers whether a cost of 1 would be allowed now.
local key = KEYS[1]
local limit, period = tonumber(ARGV[1]), tonumber(ARGV[2])
local period_ms, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local not_after = tonumber(ARGV[5])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Too late: the caller was answered without this check (by the failure mode), so it changes
-- nothing.
if not_after > 0 and now > not_after then
  return {2, 0, 0, 0, now}
end
-- A unit allowed at s counts while now < s + period.
local cutoff = now - period

-- Members at or below the cutoff are stale: a check removes them first, a peek skips them.
local stale = 0
local used
if cost == 0 then
  stale = redis.call('ZCOUNT', key, '-inf', string.format('%.0f', cutoff))
  used = redis.call('ZCARD', key) - stale
else
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', cutoff))
  used = redis.call('ZCARD', key)
end

-- Time until the k-th oldest live unit leaves the window, by rank (O(log n)); -1 when there is
-- no such unit.
local function leaves(k)
  if k < 1 then
    return -1
  end
  local found = redis.call('ZRANGE', key, stale + k - 1, stale + k - 1, 'WITHSCORES')
  if found[2] then
    return tonumber(found[2]) + period - now
  end
  return -1
end

local n = cost
if cost == 0 then
  n = 1
end
if used + n > limit then
  local retry = -1
  if n <= limit then
    retry = leaves(used + n - limit)
  end
  return {0, math.max(0, limit - used), retry, math.max(0, leaves(used)), now}
end
if cost == 0 then
  local reset = 0
  if used > 0 then
    reset = leaves(used)
  end
  return {1, limit - used, 0, reset, now}
end

-- Members are unique: units allowed in the same microsecond are numbered after those already
-- there (all members of one score are always removed together).
local now_s = string.format('%.0f', now)
local base = redis.call('ZCOUNT', key, now_s, now_s)
local args = {}
for i = 1, cost do
  args[#args + 1] = now_s
  args[#args + 1] = now_s .. ':' .. (base + i)
  if #args >= 1000 or i == cost then
    redis.call('ZADD', key, unpack(args))
    args = {}
  end
end
redis.call('PEXPIRE', key, period_ms)
return {1, limit - used - cost, 0, period, now}
