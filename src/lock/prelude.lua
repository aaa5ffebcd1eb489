-- Shared by every lock script (concatenated in front of each one, after void.lua; see scripts.rs).
--
-- The keys of the lock NAME all carry the hash tag {lock:NAME}. Every script but the batched
-- refresh takes them all, in this order:
--
--   KEYS[1] state    hash: the leases and their holds (below); expires with the last lease
--   KEYS[2] leases   sorted set: lease id -> the latest expiry of its holds (ms, Redis time)
--   KEYS[3] fence    string: the last fencing token issued
--   KEYS[4] waiters  sorted set: waiter id -> registration expiry (ms), fair or not
--   KEYS[5] queue    sorted set: '<mode><waiter id>' -> arrival number; mode 'x' or 's'
--   KEYS[6] writers  sorted set: non-fair exclusive waiter id -> registration expiry (ms)
--   KEYS[7] channel  pub/sub channel (declared as a key: it shares the hash tag)
--   KEYS[8] void     sorted set: void tokens and waiter ids -> until when (ms; see void.lua)
--
-- A lease is one owner's tenure of the lock in one mode; its id is the fencing token it was
-- granted with. Each acquisition is a hold of a lease with a token, a ttl and an expiry of its
-- own; a re-entrant acquisition by the lease's owner adds a hold to it. A lease lasts as long as
-- its longest-lived hold, so no hold's renewal, refresh or release ever shortens what another
-- hold of the same lease was promised. The state hash holds:
--
--   'x'         -> the id of the exclusive lease, while there is one
--   'l:<id>'    -> the lease: cmsgpack of {mode, owner, holds}, each hold {token, expiry, ttl, key,
--                  claims, lost, claimers}: claims counts the retries with its idempotency key that
--                  got it again and may have reached their callers, claimers lists those retries'
--                  own tokens (at most MAX_CLAIMERS, the latest), lost is 1 once the call that
--                  granted it was known not to reach its caller
--   'c:<token>' -> the token of the hold that the retry whose own token this is got again
--   't:<token>' -> the id of the lease the hold belongs to
--   'o:<owner>' -> the id of the owner's lease (named owners only: an anonymous caller never
--                  re-enters)
--   'i:<key>'   -> the token of the hold an idempotency key granted
--
-- Leases and holds whose expiry has passed (by Redis time) are dropped by the next script that
-- changes the lock; reads ignore them.
local K = {
  state = KEYS[1], leases = KEYS[2], fence = KEYS[3], waiters = KEYS[4], queue = KEYS[5],
  writers = KEYS[6], channel = KEYS[7], void = KEYS[8],
}

-- Most shared waiters at the head of the queue woken (and granted) together; longer runs follow
-- as those ahead of them are granted.
local MAX_WAKE = 64

-- Redis time: milliseconds, and microseconds.
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

-- Hold fields.
local TOKEN, EXPIRY, TTL, KEY, CLAIMS, LOST, CLAIMERS = 1, 2, 3, 4, 5, 6, 7
-- Most retries of one hold whose claims are remembered by their token.
local MAX_CLAIMERS = 16

-- The lease `id`, or nil.
local function lease_of(id)
  local raw = redis.call('HGET', K.state, 'l:' .. id)
  if raw then
    return cmsgpack.unpack(raw)
  end
  return nil
end

-- The hold of `lease` with `token`, and its index, when it has not expired.
local function hold_of(lease, token, now)
  for i, h in ipairs(lease.holds) do
    if h[TOKEN] == token then
      if h[EXPIRY] > now then
        return h, i
      end
      return nil, i
    end
  end
  return nil, nil
end

local function forget_hold(h)
  redis.call('HDEL', K.state, 't:' .. h[TOKEN])
  -- The key may name a newer hold by now (this one expired, and a retry with the key took
  -- another): that entry stays.
  if h[KEY] ~= '' and redis.call('HGET', K.state, 'i:' .. h[KEY]) == h[TOKEN] then
    redis.call('HDEL', K.state, 'i:' .. h[KEY])
  end
  for _, claimer in ipairs(h[CLAIMERS] or {}) do
    redis.call('HDEL', K.state, 'c:' .. claimer)
  end
end

-- Forgets the lease `id` and all its holds.
local function drop_lease(id, lease)
  if lease then
    for _, h in ipairs(lease.holds) do
      forget_hold(h)
    end
    if lease.owner ~= '' and redis.call('HGET', K.state, 'o:' .. lease.owner) == id then
      redis.call('HDEL', K.state, 'o:' .. lease.owner)
    end
  end
  redis.call('HDEL', K.state, 'l:' .. id)
  redis.call('ZREM', K.leases, id)
  if redis.call('HGET', K.state, 'x') == id then
    redis.call('HDEL', K.state, 'x')
  end
end

-- Stores `lease` after dropping its expired holds: its expiry becomes the latest of its live
-- holds'. Forgets it when none is live. Returns that expiry, or nil.
--
-- When that expiry comes sooner than before (a refresh with a shorter ttl, the release of the
-- longest-lived hold), the waiters are told by a broadcast: each waits for the expiry its last
-- attempt found, and tries again now to find the new one.
local function save_lease(id, lease, now)
  local live, latest = {}, nil
  for _, h in ipairs(lease.holds) do
    if h[EXPIRY] > now then
      live[#live + 1] = h
      if not latest or h[EXPIRY] > latest then
        latest = h[EXPIRY]
      end
    else
      forget_hold(h)
    end
  end
  lease.holds = live
  if not latest then
    drop_lease(id, lease)
    return nil
  end
  redis.call('HSET', K.state, 'l:' .. id, cmsgpack.pack(lease))
  local before = redis.call('ZSCORE', K.leases, id)
  redis.call('ZADD', K.leases, latest, id)
  if before and latest < tonumber(before) and redis.call('ZCARD', K.waiters) > 0 then
    redis.pcall(PUBLISH, K.channel, 'shortened')
  end
  return latest
end

-- Drops every lease whose holds have all expired by Redis's clock.
local function reclaim(now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.leases, '-inf', now)) do
    drop_lease(id, lease_of(id))
  end
end

-- Keeps the lease keys until the last lease ends; deletes them when none is left.
local function touch_leases(now)
  local last = redis.call('ZRANGE', K.leases, -1, -1, 'WITHSCORES')
  if last[2] then
    local keep = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', K.state, keep)
    redis.call('PEXPIRE', K.leases, keep)
  else
    redis.call('DEL', K.state, K.leases)
  end
end

-- The id of the exclusive lease when it is live.
local function exclusive(now)
  local id = redis.call('HGET', K.state, 'x')
  if id then
    local expiry = redis.call('ZSCORE', K.leases, id)
    if expiry and tonumber(expiry) > now then
      return id
    end
  end
  return nil
end

-- Shared leases not yet expired.
local function live_shared(now)
  local live = redis.call('ZCOUNT', K.leases, '(' .. now, '+inf')
  if exclusive(now) then
    live = live - 1
  end
  return live
end

-- Forgets a waiter; returns whether it had a place in the fair queue.
local function drop_waiter(id)
  redis.call('ZREM', K.waiters, id)
  redis.call('ZREM', K.writers, id)
  return redis.call('ZREM', K.queue, 'x' .. id, 's' .. id) > 0
end

-- Forgets waiters whose registration expired (their wait ended or their Baton died); returns
-- whether one of them had a place in the fair queue.
local function purge_waiters(now)
  local queued = false
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.waiters, '-inf', now)) do
    if drop_waiter(id) then
      queued = true
    end
  end
  redis.call('ZREMRANGEBYSCORE', K.writers, '-inf', now)
  return queued
end

-- Keeps the waiter keys until the last registration ends; deletes them when none is left.
local function touch_waiters(now)
  local last = redis.call('ZRANGE', K.waiters, -1, -1, 'WITHSCORES')
  if last[2] then
    local keep = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', K.waiters, keep)
    redis.call('PEXPIRE', K.queue, keep)
    redis.call('PEXPIRE', K.writers, keep)
  else
    redis.call('DEL', K.waiters, K.queue, K.writers)
  end
end

-- The first `n` places of the fair queue, after dropping from its head every place whose
-- registration has ended.
local function queue_head(now, n)
  while true do
    local head = redis.call('ZRANGE', K.queue, 0, n - 1)
    if not head[1] then
      return head
    end
    local registered = redis.call('ZSCORE', K.waiters, string.sub(head[1], 2))
    if registered and tonumber(registered) > now then
      return head
    end
    redis.call('ZREM', K.queue, head[1])
  end
end

-- Wakes whoever may go ahead now: with a fair queue, only its head, when it can be granted (the
-- run of shared waiters at the head, up to MAX_WAKE, when the head is shared), each by a message
-- addressed to it; with nobody queued, every waiter by one broadcast, sent when `always` or when
-- anyone waits.
local function wake(now, always)
  local head = queue_head(now, MAX_WAKE)
  if head[1] then
    if exclusive(now) then
      return
    end
    if string.sub(head[1], 1, 1) == 'x' then
      if live_shared(now) == 0 then
        redis.pcall(PUBLISH, K.channel, '@' .. string.sub(head[1], 2))
      end
      return
    end
    for _, place in ipairs(head) do
      if string.sub(place, 1, 1) ~= 's' then
        break
      end
      redis.pcall(PUBLISH, K.channel, '@' .. string.sub(place, 2))
    end
  elseif always or redis.call('ZCARD', K.waiters) > 0 then
    redis.pcall(PUBLISH, K.channel, 'released')
  end
end

-- Sets the expiry of the hold `token` to now + `ttl` ms (0: the ttl it was acquired with); the
-- lease lasts as long as its longest-lived hold. Returns the hold's new remaining ttl, -1 when
-- the token holds nothing, or -2 (changing nothing) when the ttl would be below `min` ms.
local function refresh_hold(token, ttl, min, now)
  local id = redis.call('HGET', K.state, 't:' .. token)
  local lease = id and lease_of(id)
  if not lease then
    return -1
  end
  local h = hold_of(lease, token, now)
  if not h then
    return -1
  end
  if ttl == 0 then
    ttl = h[TTL]
  end
  if ttl < min then
    return -2
  end
  h[EXPIRY] = now + ttl
  save_lease(id, lease, now)
  touch_leases(now)
  return ttl
end
