-- Describe: read a lock's state without changing anything.
--
-- KEYS: state, fence, waiters, then readers, shared, queue (see the prelude).
--
-- Returns {mode ('x', 's' or ''), exclusive owner, exclusive hold count, fencing token, remaining
-- ms (exclusive holder's; shared: the longest; -2 when free), waiters, shared holder count, queued
-- waiters, {owner, hold count, remaining ms, fence} of the shared holder whose lease ends first
-- (empty unless shared)}.
local K = lock_keys({'state', 'fence', 'waiters', 'readers', 'shared', 'queue'})
local now = clock()
local waiting = redis.call('ZCOUNT', K.waiters, '(' .. now, '+inf')
-- Places whose registration ended are still in the queue until a script drops them.
local queued = redis.call('ZCARD', K.queue)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.waiters, '-inf', now)) do
  if redis.call('ZSCORE', K.queue, 'x' .. id) or redis.call('ZSCORE', K.queue, 's' .. id) then
    queued = queued - 1
  end
end

local holder = redis.call('HMGET', K.state, 'owner', 'count', 'fence')
if holder[1] then
  return {'x', holder[1], tonumber(holder[2]), holder[3], redis.call('PTTL', K.state), waiting, 0,
          queued, {}}
end
local latest = redis.call('GET', K.fence) or '0'
local readers = live_readers(K, now)
if readers > 0 then
  local first = redis.call('ZRANGEBYSCORE', K.readers, '(' .. now, '+inf', 'WITHSCORES',
                          'LIMIT', 0, 1)
  local last = redis.call('ZRANGE', K.readers, -1, -1, 'WITHSCORES')
  local r = reader(K, first[1]) or {owner = '', count = 0, fence = '0'}
  return {'s', '', 0, latest, tonumber(last[2]) - now, waiting, readers, queued,
          {r.owner, r.count, tonumber(first[2]) - now, r.fence}}
end
return {'', '', 0, latest, -2, waiting, 0, queued, {}}
