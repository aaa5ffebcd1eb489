-- Acquire: grant a hold of the lock, exclusive or shared, when it is compatible with the current
-- leases and it is the caller's turn; add a hold to the caller's own lease when its owner already
-- holds the lock; or else register the caller as a waiter and say what keeps it out.
--
-- KEYS: the prelude's eight.
-- ARGV[1] owner ('' for an anonymous caller, who never re-enters)   ARGV[2] token of the new hold
-- ARGV[3] ttl ms   ARGV[4] waiter id ('' when the caller does not wait)   ARGV[5] wait left ms
-- ARGV[6] fence retention ms   ARGV[7] '1' to wait in the fair queue   ARGV[8] mode 'x' or 's'
-- ARGV[9] registration lease ms of fair and exclusive waiters
-- ARGV[10] idempotency key ('' for none)   ARGV[11] most holds a lease may have
--
-- Turns: a fair waiter with a place in the queue goes when it is the head (exclusive), or when
-- only shared waiters are ahead of it, at most MAX_WAKE - 1 of them (shared). Anyone else goes
-- only when nobody is queued; a shared request also waits while a non-fair exclusive request is
-- registered as waiting, so a stream of readers cannot starve a writer. Re-entrant acquisitions
-- never wait.
--
-- Returns {1, token, fence, remaining ms, live holds of the lease, mode} when granted (a retry
-- with an idempotency key that already granted gets that hold again); {0, ms left on what keeps
-- the caller out (-2: nothing known), ms until the state may change without a message (-1: never)}
-- when not; {-1} when the owner holds the lock shared and asks for it exclusively (refused: it
-- would deadlock); {-3} when the owner's lease has the most holds allowed; {-4} when the
-- idempotency key granted a hold of another owner or mode.
local owner, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local waiter, wait_ms, retention = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local fair, mode, lease_ms = ARGV[7] == '1', ARGV[8], tonumber(ARGV[9])
local key, max_holds = ARGV[10], tonumber(ARGV[11])

local now, now_us = clock()
-- A late call whose clean-up already ran (void.lua) changes nothing.
if voided(K.void, token, waiter, now) then
  return {0, -2, -1}
end
reclaim(now)
local moved = purge_waiters(now)

-- After a grant: the caller stops waiting. When it leaves the fair queue as a shared holder, the
-- shared waiter that moves into the woken run at the head is woken too, and waiters without a
-- place (kept out by the queue) look again once the queue is empty.
local function settle(m)
  if waiter ~= '' and drop_waiter(waiter) and m == 's' then
    local run = redis.call('ZRANGE', K.queue, 0, MAX_WAKE - 1)
    if #run == MAX_WAKE then
      local all_shared = true
      for _, place in ipairs(run) do
        if string.sub(place, 1, 1) ~= 's' then
          all_shared = false
          break
        end
      end
      if all_shared then
        redis.pcall(PUBLISH, K.channel, '@' .. string.sub(run[MAX_WAKE], 2))
      end
    elseif #run == 0 and redis.call('ZCARD', K.waiters) > 0 then
      redis.pcall(PUBLISH, K.channel, 'released')
    end
  end
  if moved then
    wake(now, false)
  end
  if waiter ~= '' or moved then
    touch_waiters(now)
  end
end

-- Adds a hold to `lease` (id `id`) and returns the grant.
local function add_hold(id, lease)
  lease.holds[#lease.holds + 1] = {token, now + ttl, ttl, key, 0}
  redis.call('HSET', K.state, 't:' .. token, id)
  if key ~= '' then
    redis.call('HSET', K.state, 'i:' .. key, token)
  end
  save_lease(id, lease, now)
  touch_leases(now)
  settle(lease.mode)
  return {1, token, id, ttl, #lease.holds, lease.mode}
end

-- A retry of an acquisition that already granted: the same hold again.
if key ~= '' then
  local granted = redis.call('HGET', K.state, 'i:' .. key)
  local id = granted and redis.call('HGET', K.state, 't:' .. granted)
  local lease = id and lease_of(id)
  local h = lease and hold_of(lease, granted, now)
  if h then
    if lease.owner ~= owner or (lease.mode == 's' and mode == 'x') then
      return {-4}
    end
    -- Claimed by its caller's retry: a clean-up that gives up unclaimed grants leaves it alone,
    -- until this retry's own clean-up (under its own token) withdraws the claim. The oldest claim
    -- remembered gives way past MAX_CLAIMERS: its clean-up then keeps the hold (until its ttl).
    h[CLAIMS] = h[CLAIMS] + 1
    h[LOST] = h[LOST] or 0
    local claimers = h[CLAIMERS] or {}
    if #claimers >= MAX_CLAIMERS then
      redis.call('HDEL', K.state, 'c:' .. table.remove(claimers, 1))
    end
    claimers[#claimers + 1] = token
    h[CLAIMERS] = claimers
    redis.call('HSET', K.state, 'c:' .. token, granted)
    redis.call('HSET', K.state, 'l:' .. id, cmsgpack.pack(lease))
    settle(lease.mode)
    return {1, granted, id, h[EXPIRY] - now, #lease.holds, lease.mode}
  end
end

-- Re-entrancy: the owner's exclusive lease takes requests of either mode, its shared lease shared
-- ones; an exclusive request would wait for itself.
if owner ~= '' then
  local id = redis.call('HGET', K.state, 'o:' .. owner)
  local lease = id and lease_of(id)
  if lease then
    if lease.mode == 's' and mode == 'x' then
      return {-1}
    end
    if #lease.holds >= max_holds then
      return {-3}
    end
    return add_hold(id, lease)
  end
end

-- Whose turn it is.
local queued = false
if fair and waiter ~= '' then
  local place = mode .. waiter
  if wait_ms > 0 then
    if not redis.call('ZSCORE', K.queue, place) then
      local last = redis.call('ZRANGE', K.queue, -1, -1, 'WITHSCORES')
      redis.call('ZADD', K.queue, last[2] and tonumber(last[2]) + 1 or 1, place)
    end
    redis.call('ZADD', K.waiters, now + math.min(lease_ms, wait_ms), waiter)
  end
  queued = true
end
local head = queue_head(now, MAX_WAKE)
local rank = queued and redis.call('ZRANK', K.queue, mode .. waiter) or nil
local turn
if rank then
  turn = rank == 0 or (mode == 's' and rank < MAX_WAKE)
  if turn then
    for i = 1, rank do
      if string.sub(head[i], 1, 1) ~= 's' then
        turn = false
        break
      end
    end
  end
else
  turn = head[1] == nil and (mode == 'x' or redis.call('ZCARD', K.writers) == 0)
end

-- After `reclaim`, every lease left is live.
local holder = redis.call('HGET', K.state, 'x')
local shared = redis.call('ZCARD', K.leases) - (holder and 1 or 0)
local free = not holder and (mode == 's' or shared == 0)

if turn and free then
  -- Fencing tokens never go backwards: at least one more than the last one kept, and at least the
  -- Redis clock in microseconds, so they stay increasing after the fence key expired or Redis
  -- restarted from an older snapshot.
  local last = tonumber(redis.call('GET', K.fence) or '0')
  local id = string.format('%.0f', math.max(last + 1, now_us))
  redis.call('SET', K.fence, id, 'PX', math.max(redis.call('PTTL', K.fence), ttl + retention))
  if owner ~= '' then
    redis.call('HSET', K.state, 'o:' .. owner, id)
  end
  if mode == 'x' then
    redis.call('HSET', K.state, 'x', id)
  end
  return add_hold(id, {mode = mode, owner = owner, holds = {}})
end

-- Not granted: register a waiter without a place in the queue (an exclusive one also as a writer,
-- which keeps new shared requests out).
if waiter ~= '' and wait_ms > 0 and not fair then
  if mode == 'x' then
    local until_ms = now + math.min(lease_ms, wait_ms)
    redis.call('ZADD', K.waiters, until_ms, waiter)
    redis.call('ZADD', K.writers, until_ms, waiter)
  else
    redis.call('ZADD', K.waiters, now + wait_ms, waiter)
  end
end
if moved then
  wake(now, false)
end
if waiter ~= '' or moved then
  touch_waiters(now)
end

-- What keeps the caller out, and when that may change without a message. On its turn: a lease's
-- expiry. Behind the queue: the end of the head's registration, should its Baton stop renewing it
-- (only the head wakes at a lease's expiry). Behind a waiting writer: the end of its registration.
local blocking, change = -2, -1
local function sooner(ms)
  if ms >= 0 and (change < 0 or ms < change) then
    change = ms
  end
end
if holder then
  blocking = tonumber(redis.call('ZSCORE', K.leases, holder)) - now
  if turn then
    sooner(blocking)
  end
elseif mode == 'x' and shared > 0 then
  local last = redis.call('ZRANGE', K.leases, -1, -1, 'WITHSCORES')
  blocking = tonumber(last[2]) - now
  if turn then
    local first = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
    sooner(tonumber(first[2]) - now)
  end
end
if not turn then
  if head[1] then
    sooner(tonumber(redis.call('ZSCORE', K.waiters, string.sub(head[1], 2))) - now)
  else
    local writer = redis.call('ZRANGE', K.writers, 0, 0, 'WITHSCORES')
    if writer[2] then
      sooner(tonumber(writer[2]) - now)
    end
  end
end
return {0, blocking, change}
