-- Acquire: grant `permits` permits if they fit under the strictest limit and it is the caller's
-- turn (fair waiters first, in arrival order); otherwise register the caller as a waiter.
--
-- ARGV[1] token   ARGV[2] owner   ARGV[3] permits   ARGV[4] limit   ARGV[5] ttl ms
-- ARGV[6] waiter id ('' when the caller does not wait)   ARGV[7] '1' for fair
-- ARGV[8] wait left ms   ARGV[9] fair queue registration lease ms   ARGV[10] fence retention ms
-- ARGV[11] idempotency key ('' for none)
--
-- Returns {1, fence, remaining ms, limit in force, permits still available, token} when granted
-- (a retry with an idempotency key that already granted gets that lease again), {0, permits
-- available, ms until the earliest holder lease ends, ms until that or the earliest waiter
-- registration ends} (-1: none), or {-4} when the idempotency key granted a different request.
local token, owner = ARGV[1], ARGV[2]
local permits, limit, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local waiter, fair, wait_ms = ARGV[6], ARGV[7] == '1', tonumber(ARGV[8])
local queue_lease, retention, key = tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11]

local now, now_us = clock()
-- A late call whose clean-up already ran (void.lua) changes nothing.
if voided(V, token, waiter, now) then
  return {0, 0, -1, -1}
end
reclaim(now)
purge_waiters(now)

-- A retry of an acquisition that already granted: the same lease again.
if key ~= '' then
  local granted = redis.call('HGET', D, 'i:' .. key)
  local h = granted and holder(granted)
  if h then
    if h.permits ~= permits or h.limit ~= limit or h.owner ~= owner then
      return {-4}
    end
    if waiter ~= '' then
      drop_waiter(waiter)
    end
    -- Claimed by its caller's retry: a clean-up that gives up unclaimed grants leaves it alone,
    -- until this retry's own clean-up (under its own token) withdraws the claim. The oldest claim
    -- remembered gives way past MAX_CLAIMERS: its clean-up then keeps the lease (until its ttl).
    redis.call('HINCRBY', D, 'c:' .. granted, 1)
    local claimers = claimers_of(granted)
    if #claimers >= MAX_CLAIMERS then
      redis.call('HDEL', D, 'r:' .. table.remove(claimers, 1))
    end
    claimers[#claimers + 1] = token
    redis.call('HSET', D, 'R:' .. granted, table.concat(claimers, ' '), 'r:' .. token, granted)
    local left = redis.call('ZRANGE', L, 0, 0, 'WITHSCORES')
    local in_force = math.min(limit, tonumber(left[2] or limit))
    return {1, h.fence, tonumber(redis.call('ZSCORE', H, granted)) - now, in_force,
            math.max(in_force - in_use(), 0), granted}
  end
end

local strictest = limit
local lowest = redis.call('ZRANGE', L, 0, 0, 'WITHSCORES')
if lowest[2] then
  strictest = math.min(strictest, tonumber(lowest[2]))
end
local used = in_use()

local turn
if fair and waiter ~= '' then
  if not redis.call('ZSCORE', Q, waiter) and wait_ms > 0 then
    redis.call('ZADD', Q, redis.call('HINCRBY', D, 'seq', 1), waiter)
    redis.call('HSET', D, 'q:' .. waiter, permits .. '|' .. limit)
  end
  if wait_ms > 0 then
    redis.call('ZADD', W, now + math.min(queue_lease, wait_ms), waiter)
  end
  local rank = redis.call('ZRANK', Q, waiter)
  if rank then
    turn = rank == 0
  else
    turn = redis.call('ZCARD', Q) == 0
  end
else
  -- Nobody overtakes a queued fair waiter.
  turn = redis.call('ZCARD', Q) == 0
end

if turn and used + permits <= strictest then
  local last = tonumber(redis.call('GET', F) or '0')
  local fence = string.format('%.0f', math.max(last + 1, now_us))
  redis.call('SET', F, fence, 'PX', ttl + retention)
  redis.call('ZADD', H, now + ttl, token)
  redis.call('ZADD', L, limit, token)
  redis.call('HSET', D, 'h:' .. token,
             permits .. '|' .. limit .. '|' .. ttl .. '|' .. fence .. '|' .. key .. '|' .. owner,
             'last_limit', limit)
  if key ~= '' then
    redis.call('HSET', D, 'i:' .. key, token)
  end
  redis.call('HINCRBY', D, 'used', permits)
  if waiter ~= '' then
    local queued = redis.call('ZSCORE', Q, waiter)
    drop_waiter(waiter)
    -- The queue moved: the next fair waiter, or the others it was holding back, may fit now.
    if queued and redis.call('ZCARD', W) > 0 then
      redis.pcall(PUBLISH, C, 'next')
    end
  end
  touch(now)
  return {1, fence, ttl, strictest, strictest - used - permits, token}
end

if waiter ~= '' and wait_ms > 0 and not fair then
  redis.call('ZADD', W, now + wait_ms, waiter)
end
touch(now)
-- When to look again without a message: the earliest holder expiry frees permits, and the earliest
-- waiter registration expiry may drop a dead fair waiter that holds the queue.
local function earliest(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2]) - now
  end
  return -1
end
local holder_expiry, wake = earliest(H), earliest(W)
if wake < 0 or (holder_expiry >= 0 and holder_expiry < wake) then
  wake = holder_expiry
end
return {0, math.max(strictest - used, 0), holder_expiry, wake}
