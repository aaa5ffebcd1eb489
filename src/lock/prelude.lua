-- Shared by every lock script (concatenated in front of each one; see `source` in mod.rs).
--
-- The keys of the lock NAME all carry the hash tag {lock:NAME}. Each script takes the ones it
-- needs in an order of its own (the order it has always had first, new keys after); a key a caller
-- leaves out is derived from the state key's name, so callers that still pass only the keys of an
-- older version keep working on a single Redis.
--
--   state    hash: the exclusive holder: owner, token, count, fence, ttl; expires with its lease
--   fence    string: the last fencing token issued
--   waiters  sorted set: waiter id -> registration expiry (ms, Redis time), fair or not
--   channel  pub/sub channel (declared as a key: it shares the hash tag)
--   readers  sorted set: shared lease token -> lease expiry (ms)
--   shared   hash: 't:<token>' -> 'count|ttl|fence|owner', 'o:<owner>' -> token of its shared lease
--   queue    sorted set: '<mode><waiter id>' -> arrival number; mode 'x' exclusive, 's' shared
--   writers  sorted set: non-fair exclusive waiter id -> registration expiry (ms)
--
-- A queued waiter's place lasts as long as its registration in `waiters`; a place without one is
-- dropped when it reaches the head of the queue.

local SUFFIXES = {
  fence = ':fence', waiters = ':waiters', channel = ':released', readers = ':readers',
  shared = ':shared', queue = ':queue', writers = ':writers',
}

-- Most shared waiters at the head of the queue woken (and granted) together; longer runs follow
-- as those ahead of them are granted.
local MAX_WAKE = 64

-- The keys, named: `names` lists the script's KEYS in order, starting after KEYS[offset].
local function lock_keys(names, offset)
  offset = offset or 0
  local K = {}
  for i, name in ipairs(names) do
    K[name] = KEYS[offset + i]
  end
  for name, suffix in pairs(SUFFIXES) do
    if not K[name] then
      K[name] = K.state .. suffix
    end
  end
  return K
end

-- Redis time: milliseconds, and microseconds.
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

-- A shared lease's record, or nil.
local function reader(K, token)
  local rec = redis.call('HGET', K.shared, 't:' .. token)
  if not rec then
    return nil
  end
  local count, ttl, fence, owner = string.match(rec, '^(%d+)|(%d+)|(%d+)|(.*)$')
  return {count = tonumber(count), ttl = tonumber(ttl), fence = fence, owner = owner}
end

local function save_reader(K, token, r)
  local rec = r.count .. '|' .. r.ttl .. '|' .. r.fence .. '|' .. r.owner
  redis.call('HSET', K.shared, 't:' .. token, rec, 'o:' .. r.owner, token)
end

local function drop_reader(K, token)
  local r = reader(K, token)
  redis.call('ZREM', K.readers, token)
  redis.call('HDEL', K.shared, 't:' .. token)
  if r and redis.call('HGET', K.shared, 'o:' .. r.owner) == token then
    redis.call('HDEL', K.shared, 'o:' .. r.owner)
  end
end

-- Drops every shared lease that has expired by Redis's clock.
local function reclaim_readers(K, now)
  for _, token in ipairs(redis.call('ZRANGEBYSCORE', K.readers, '-inf', now)) do
    drop_reader(K, token)
  end
end

-- Shared leases not yet expired.
local function live_readers(K, now)
  return redis.call('ZCOUNT', K.readers, '(' .. now, '+inf')
end

-- Keeps the shared-lease keys until the last shared lease ends; deletes them when none is left.
local function touch_readers(K, now)
  local last = redis.call('ZRANGE', K.readers, -1, -1, 'WITHSCORES')
  if last[2] then
    local keep = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', K.readers, keep)
    redis.call('PEXPIRE', K.shared, keep)
  else
    redis.call('DEL', K.readers, K.shared)
  end
end

-- Forgets a waiter; returns whether it had a place in the fair queue.
local function drop_waiter(K, id)
  redis.call('ZREM', K.waiters, id)
  redis.call('ZREM', K.writers, id)
  return redis.call('ZREM', K.queue, 'x' .. id, 's' .. id) > 0
end

-- Forgets waiters whose registration expired (their wait ended or their Baton died); returns
-- whether one of them had a place in the fair queue.
local function purge_waiters(K, now)
  local queued = false
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.waiters, '-inf', now)) do
    if drop_waiter(K, id) then
      queued = true
    end
  end
  redis.call('ZREMRANGEBYSCORE', K.writers, '-inf', now)
  return queued
end

-- Keeps the waiter keys until the last registration ends; deletes them when none is left.
local function touch_waiters(K, now)
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
local function queue_head(K, now, n)
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
local function wake(K, now, always)
  local head = queue_head(K, now, MAX_WAKE)
  if head[1] then
    if redis.call('EXISTS', K.state) == 1 then
      return
    end
    if string.sub(head[1], 1, 1) == 'x' then
      if live_readers(K, now) == 0 then
        redis.call(PUBLISH, K.channel, '@' .. string.sub(head[1], 2))
      end
      return
    end
    for _, place in ipairs(head) do
      if string.sub(place, 1, 1) ~= 's' then
        break
      end
      redis.call(PUBLISH, K.channel, '@' .. string.sub(place, 2))
    end
  elseif always or redis.call('ZCARD', K.waiters) > 0 then
    redis.call(PUBLISH, K.channel, 'released')
  end
end

-- Sets the remaining ttl of the lease `token`, exclusive or shared, to `ttl` ms (0: the ttl it was
-- acquired with). Returns the new ttl, -1 when the token holds no lease, or -2 (changing nothing)
-- when the ttl would be below `min` ms.
local function refresh_lease(K, token, ttl, min)
  local holder = redis.call('HMGET', K.state, 'token', 'ttl')
  if holder[1] == token then
    if ttl == 0 then
      ttl = tonumber(holder[2])
    end
    if ttl < min then
      return -2
    end
    redis.call('PEXPIRE', K.state, ttl)
    return ttl
  end
  local expiry = redis.call('ZSCORE', K.readers, token)
  if not expiry then
    return -1
  end
  local now = clock()
  local r = reader(K, token)
  if tonumber(expiry) <= now or not r then
    return -1
  end
  if ttl == 0 then
    ttl = r.ttl
  end
  if ttl < min then
    return -2
  end
  redis.call('ZADD', K.readers, 'XX', now + ttl, token)
  touch_readers(K, now)
  return ttl
end

