-- Shared by every semaphore script (concatenated in front of each one, after void.lua, at build
-- time).
--
-- KEYS[1] holders   sorted set: lease token -> expiry (ms, Redis time)
-- KEYS[2] data      hash: 'h:<token>' -> "permits|limit|ttl|fence|key|owner" (owner '' for an
--                   anonymous holder; key: the idempotency key that granted it, or ''), 'used'
--                   (permits held by holders not yet reclaimed), 'last_limit', 'seq' (fair queue
--                   arrival counter), 'q:<waiter>' -> "permits|limit" for queued fair waiters,
--                   'i:<key>' -> the token an idempotency key granted, 'c:<token>' -> how many
--                   retries with that key got the lease again and may have reached their callers
--                   (claims), 'R:<token>' -> those retries' own tokens, space-separated (at most
--                   MAX_CLAIMERS, the latest), 'r:<retry token>' -> the token of the lease it got
--                   again, 'x:<token>' -> 1 once the call that granted it was known not to reach
--                   its caller
-- KEYS[3] limits    sorted set: lease token -> the limit its holder asked for
-- KEYS[4] queue     sorted set: fair waiter id -> arrival number
-- KEYS[5] waiters   sorted set: waiter id (fair or not) -> expiry of its registration (ms)
-- KEYS[6] fence     string: last fencing token issued
-- KEYS[7] channel   pub/sub channel woken on every release (declared: it shares the hash tag)
-- KEYS[8] void      sorted set: void tokens and waiter ids -> until when (ms; see void.lua)
local H, D, L, Q, W, F, C, V =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]

-- How long keys outlive the last lease or wait they record, so `Describe` can still report the
-- semaphore's limit for a while; 60 s.
local LINGER_MS = 60000

local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

local function holder(token)
  local rec = redis.call('HGET', D, 'h:' .. token)
  if not rec then
    return nil
  end
  local permits, limit, ttl, fence, key, owner =
    string.match(rec, '^(%d+)|(%d+)|(%d+)|(%d+)|([^|]*)|(.*)$')
  return {permits = tonumber(permits), limit = tonumber(limit), ttl = tonumber(ttl),
          fence = fence, key = key, owner = owner}
end

-- Most retries of one lease whose claims are remembered by their token.
local MAX_CLAIMERS = 16

-- The tokens of the retries that claimed the lease `token` (the 'R:' field), oldest first.
local function claimers_of(token)
  local list = {}
  for claimer in string.gmatch(redis.call('HGET', D, 'R:' .. token) or '', '%S+') do
    list[#list + 1] = claimer
  end
  return list
end

local function drop_holder(token)
  local h = holder(token)
  redis.call('ZREM', H, token)
  redis.call('ZREM', L, token)
  redis.call('HDEL', D, 'h:' .. token)
  if h then
    redis.call('HINCRBY', D, 'used', -h.permits)
    if h.key ~= '' then
      -- The key may name a newer lease by now (this one expired, and a retry with the key took
      -- another): that entry stays.
      if redis.call('HGET', D, 'i:' .. h.key) == token then
        redis.call('HDEL', D, 'i:' .. h.key)
      end
      redis.call('HDEL', D, 'c:' .. token, 'x:' .. token)
      for _, claimer in ipairs(claimers_of(token)) do
        redis.call('HDEL', D, 'r:' .. claimer)
      end
      redis.call('HDEL', D, 'R:' .. token)
    end
  end
  return h
end

-- Reclaims every holder whose lease has expired by Redis's clock.
local function reclaim(now)
  for _, token in ipairs(redis.call('ZRANGEBYSCORE', H, '-inf', now)) do
    drop_holder(token)
  end
end

local function drop_waiter(waiter)
  redis.call('ZREM', Q, waiter)
  redis.call('ZREM', W, waiter)
  redis.call('HDEL', D, 'q:' .. waiter)
end

-- Forgets waiters whose registration expired (their wait ended or their Baton died).
local function purge_waiters(now)
  for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', W, '-inf', now)) do
    drop_waiter(waiter)
  end
end

-- Permits held by holders not yet reclaimed. The counter is rebuilt from the holder records if
-- it is missing (the data hash expired between uses).
local function in_use()
  local used = redis.call('HGET', D, 'used')
  if used then
    return tonumber(used)
  end
  local total = 0
  for _, token in ipairs(redis.call('ZRANGE', H, 0, -1)) do
    local h = holder(token)
    if h then
      total = total + h.permits
    end
  end
  redis.call('HSET', D, 'used', total)
  return total
end

-- Keeps every key alive until the last lease or waiter registration it records ends, plus
-- LINGER_MS.
local function touch(now)
  local last = now
  local h = redis.call('ZRANGE', H, -1, -1, 'WITHSCORES')
  if h[2] then
    last = math.max(last, tonumber(h[2]))
  end
  local w = redis.call('ZRANGE', W, -1, -1, 'WITHSCORES')
  if w[2] then
    last = math.max(last, tonumber(w[2]))
  end
  local keep = last - now + LINGER_MS
  for _, key in ipairs({H, D, L, Q, W}) do
    redis.call('PEXPIRE', key, keep)
  end
end


-- Sets the remaining ttl of the lease `token` (ttl 0 reuses its acquisition ttl). Returns the new
-- remaining ttl in ms, -1 when the token holds no unexpired lease, or -2 when the ttl would be
-- below `min` (nothing changes then). A lease that now ends sooner than before tells the waiters
-- by a broadcast: each waits for the earliest expiry its last attempt found, and tries again now
-- to find the new one.
local function refresh_lease(token, ttl, min, now)
  local expiry = redis.call('ZSCORE', H, token)
  if not expiry or tonumber(expiry) <= now then
    return -1
  end
  local h = holder(token)
  if not h then
    return -1
  end
  if ttl == 0 then
    ttl = h.ttl
  end
  if ttl < min then
    return -2
  end
  redis.call('ZADD', H, 'XX', now + ttl, token)
  if now + ttl < tonumber(expiry) and redis.call('ZCARD', W) > 0 then
    redis.pcall(PUBLISH, C, 'shortened')
  end
  touch(now)
  return ttl
end
