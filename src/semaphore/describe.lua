-- Describe: read the semaphore's state without changing anything.
--
-- ARGV[1] most holders to list
--
-- Returns {limit in force, permits in use, holder count, waiters, fence, {holders...}} where each
-- holder is {owner, permits, remaining ms, fence, limit}, soonest to expire first.
local now = clock()
local live = redis.call('ZRANGEBYSCORE', H, '(' .. now, '+inf', 'WITHSCORES')
local most = tonumber(ARGV[1])
local in_use, strictest, listed = 0, nil, {}
for i = 1, #live, 2 do
  local h = holder(live[i])
  if h then
    in_use = in_use + h.permits
    if not strictest or h.limit < strictest then
      strictest = h.limit
    end
    if #listed < most then
      table.insert(listed, {h.owner, h.permits, tonumber(live[i + 1]) - now, h.fence, h.limit})
    end
  end
end
if not strictest then
  strictest = tonumber(redis.call('HGET', D, 'last_limit') or '0')
end
local waiting = redis.call('ZCOUNT', W, '(' .. now, '+inf')
return {strictest, in_use, #live / 2, waiting, redis.call('GET', F) or '0', listed}
