-- Describe: read a lock's state without changing anything.
--
-- KEYS[1] state hash   KEYS[2] fence   KEYS[3] waiters
--
-- Returns {held (0/1), owner, hold count, fencing token, remaining ms, waiters}.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local waiting = redis.call('ZCOUNT', KEYS[3], '(' .. now_ms, '+inf')
local holder = redis.call('HMGET', KEYS[1], 'owner', 'count', 'fence')
if holder[1] then
  return {1, holder[1], tonumber(holder[2]), holder[3], redis.call('PTTL', KEYS[1]), waiting}
end
return {0, '', 0, redis.call('GET', KEYS[2]) or '0', -2, waiting}
