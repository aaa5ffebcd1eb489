-- Acquire: grant the lock if it is free, count one more hold if the caller's owner already holds
-- it, or else record the caller as a waiter and report the holder's remaining ttl.
--
-- KEYS[1] state hash  (owner, token, count, fence, ttl); expires with the lease
-- KEYS[2] fence       last fencing token issued for the name; expires ttl + retention after a grant
-- KEYS[3] waiters     sorted set: waiter id -> wait deadline (ms, Redis time)
-- ARGV[1] owner   ARGV[2] token   ARGV[3] ttl ms
-- ARGV[4] waiter id ('' when the caller does not wait)   ARGV[5] wait left ms
-- ARGV[6] fence retention ms
--
-- Returns {1, token, fence, remaining ms, hold count} when granted, {0, holder remaining ms}
-- when held by another owner (-1 when the holder's key has no expiry).
local state, fence_key, waiters = KEYS[1], KEYS[2], KEYS[3]
local owner, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local waiter, wait_ms, retention = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])

local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local now_ms = math.floor(now_us / 1000)

local holder = redis.call('HMGET', state, 'owner', 'token', 'count', 'fence')

if not holder[1] then
  -- Fencing tokens never go backwards: at least one more than the last one kept, and at least the
  -- Redis clock in microseconds, so they stay increasing after the fence key expired or Redis
  -- restarted from an older snapshot.
  local last = tonumber(redis.call('GET', fence_key) or '0')
  local fence = string.format('%.0f', math.max(last + 1, now_us))
  redis.call('SET', fence_key, fence, 'PX', ttl + retention)
  redis.call('HSET', state, 'owner', owner, 'token', token, 'count', 1, 'fence', fence, 'ttl', ttl)
  redis.call('PEXPIRE', state, ttl)
  if waiter ~= '' then
    redis.call('ZREM', waiters, waiter)
  end
  return {1, token, fence, ttl, 1}
end

if holder[1] == owner then
  local count = redis.call('HINCRBY', state, 'count', 1)
  local remaining = redis.call('PTTL', state)
  if remaining < ttl then
    redis.call('PEXPIRE', state, ttl)
    remaining = ttl
  end
  if waiter ~= '' then
    redis.call('ZREM', waiters, waiter)
  end
  return {1, holder[2], holder[4], remaining, count}
end

if waiter ~= '' then
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now_ms)
  redis.call('ZADD', waiters, now_ms + wait_ms, waiter)
  if redis.call('PTTL', waiters) < wait_ms then
    redis.call('PEXPIRE', waiters, wait_ms)
  end
end
return {0, redis.call('PTTL', state)}
