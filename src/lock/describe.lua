-- Describe: read a lock's state without changing anything.
--
-- KEYS: the prelude's eight.
--
-- Returns {mode ('x', 's' or ''), exclusive owner, live holds of the exclusive lease, fencing
-- token, remaining ms (the exclusive lease's; shared: the longest; -2 when free), waiters, shared
-- lease count, queued waiters, {owner, live holds, remaining ms, fence} of the shared lease that
-- ends first (empty unless shared)}. Tokens are never returned.
local now = clock()
local waiting = redis.call('ZCOUNT', K.waiters, '(' .. now, '+inf')
-- Places whose registration ended are still in the queue until a script drops them.
local queued = redis.call('ZCARD', K.queue)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.waiters, '-inf', now)) do
  if redis.call('ZSCORE', K.queue, 'x' .. id) or redis.call('ZSCORE', K.queue, 's' .. id) then
    queued = queued - 1
  end
end

local function live_holds(lease)
  local n = 0
  for _, h in ipairs(lease.holds) do
    if h[EXPIRY] > now then
      n = n + 1
    end
  end
  return n
end

local holder = exclusive(now)
if holder then
  local lease = lease_of(holder) or {owner = '', holds = {}}
  local remaining = tonumber(redis.call('ZSCORE', K.leases, holder)) - now
  return {'x', lease.owner, live_holds(lease), holder, remaining, waiting, 0, queued, {}}
end
local latest = redis.call('GET', K.fence) or '0'
local shared = live_shared(now)
if shared > 0 then
  local first = redis.call('ZRANGEBYSCORE', K.leases, '(' .. now, '+inf', 'WITHSCORES',
                          'LIMIT', 0, 1)
  local last = redis.call('ZRANGE', K.leases, -1, -1, 'WITHSCORES')
  local lease = lease_of(first[1]) or {owner = '', holds = {}}
  return {'s', '', 0, latest, tonumber(last[2]) - now, waiting, shared, queued,
          {lease.owner, live_holds(lease), tonumber(first[2]) - now, first[1]}}
end
return {'', '', 0, latest, -2, waiting, 0, queued, {}}
