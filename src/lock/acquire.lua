-- Acquire: grant the lock, exclusive or shared, when it is compatible with the current holders
-- and it is the caller's turn; count one more hold when the caller's owner already holds it; or
-- else register the caller as a waiter and say what keeps it out.
--
-- KEYS: state, fence, waiters, then channel, readers, shared, queue, writers (see the prelude;
-- callers of the first version pass only the first three).
-- ARGV[1] owner   ARGV[2] token   ARGV[3] ttl ms
-- ARGV[4] waiter id ('' when the caller does not wait)   ARGV[5] wait left ms
-- ARGV[6] fence retention ms
-- ARGV[7] '1' to wait in the fair queue (default '0')
-- ARGV[8] mode: 'x' exclusive or 's' shared (default 'x'); when given, replies take their
--         extended form
-- ARGV[9] registration lease ms of fair and exclusive waiters (default 0: the whole wait)
--
-- Turns: a fair waiter with a place in the queue goes when it is the head (exclusive), or when
-- only shared waiters are ahead of it, at most MAX_WAKE - 1 of them (shared). Anyone else goes
-- only when nobody is queued; a shared request also waits while a non-fair exclusive request is
-- registered as waiting, so a stream of readers cannot starve a writer. Reentrant acquisitions
-- never wait.
--
-- Returns {1, token, fence, remaining ms, hold count} when granted ({..., mode} in the extended
-- form); {0, ms left on what keeps the caller out} when not ({0, that, ms until the state may
-- change without a message} in the extended form; -1 or -2: nothing known); {-1} when the owner
-- holds the lock shared and asks for it exclusively (refused: it would deadlock).
local K = lock_keys({'state', 'fence', 'waiters', 'channel', 'readers', 'shared', 'queue',
                     'writers'})
local owner, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local waiter, wait_ms, retention = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local fair = ARGV[7] == '1'
local extended = ARGV[8] ~= nil
local mode = ARGV[8] == 's' and 's' or 'x'
local lease = tonumber(ARGV[9] or '0')
if lease <= 0 then
  lease = wait_ms
end

local now, now_us = clock()
reclaim_readers(K, now)
local moved = purge_waiters(K, now)

local function granted(tok, fence, remaining, count, m)
  if extended then
    return {1, tok, fence, remaining, count, m}
  end
  return {1, tok, fence, remaining, count}
end

-- After a grant: the caller stops waiting. When it leaves the fair queue as a shared holder, the
-- shared waiter that moves into the woken run at the head is woken too, and waiters without a
-- place (kept out by the queue) look again once the queue is empty.
local function settle(m)
  if waiter ~= '' and drop_waiter(K, waiter) and m == 's' then
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
        redis.call(PUBLISH, K.channel, '@' .. string.sub(run[MAX_WAKE], 2))
      end
    elseif #run == 0 and redis.call('ZCARD', K.waiters) > 0 then
      redis.call(PUBLISH, K.channel, 'released')
    end
  end
  if moved then
    wake(K, now, false)
  end
  if waiter ~= '' or moved then
    touch_waiters(K, now)
  end
end

-- Reentrancy: the owner's exclusive lease takes requests of either mode.
local holder = redis.call('HMGET', K.state, 'owner', 'token', 'count', 'fence')
if holder[1] == owner then
  local count = redis.call('HINCRBY', K.state, 'count', 1)
  local remaining = redis.call('PTTL', K.state)
  if remaining < ttl then
    redis.call('PEXPIRE', K.state, ttl)
    remaining = ttl
  end
  settle('x')
  return granted(holder[2], holder[4], remaining, count, 'x')
end

-- The owner's shared lease takes shared requests; an exclusive one would wait for itself.
local own = redis.call('HGET', K.shared, 'o:' .. owner)
local own_expiry = own and redis.call('ZSCORE', K.readers, own)
local mine = own_expiry and reader(K, own)
if mine then
  if mode == 'x' then
    return {-1}
  end
  mine.count = mine.count + 1
  save_reader(K, own, mine)
  local remaining = tonumber(own_expiry) - now
  if remaining < ttl then
    redis.call('ZADD', K.readers, now + ttl, own)
    remaining = ttl
    touch_readers(K, now)
  end
  settle('s')
  return granted(own, mine.fence, remaining, mine.count, 's')
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
    redis.call('ZADD', K.waiters, now + math.min(lease, wait_ms), waiter)
  end
  queued = true
end
local head = queue_head(K, now, MAX_WAKE)
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

local readers = live_readers(K, now)
local free = not holder[1] and (mode == 's' or readers == 0)

if turn and free then
  -- Fencing tokens never go backwards: at least one more than the last one kept, and at least the
  -- Redis clock in microseconds, so they stay increasing after the fence key expired or Redis
  -- restarted from an older snapshot.
  local last = tonumber(redis.call('GET', K.fence) or '0')
  local fence = string.format('%.0f', math.max(last + 1, now_us))
  redis.call('SET', K.fence, fence, 'PX', math.max(redis.call('PTTL', K.fence), ttl + retention))
  if mode == 'x' then
    redis.call('HSET', K.state, 'owner', owner, 'token', token, 'count', 1, 'fence', fence,
               'ttl', ttl)
    redis.call('PEXPIRE', K.state, ttl)
  else
    save_reader(K, token, {count = 1, ttl = ttl, fence = fence, owner = owner})
    redis.call('ZADD', K.readers, now + ttl, token)
    touch_readers(K, now)
  end
  settle(mode)
  return granted(token, fence, ttl, 1, mode)
end

-- Not granted: register a waiter without a place in the queue (an exclusive one also as a writer,
-- which keeps new shared requests out).
if waiter ~= '' and wait_ms > 0 and not fair then
  if mode == 'x' then
    local until_ms = now + math.min(lease, wait_ms)
    redis.call('ZADD', K.waiters, until_ms, waiter)
    redis.call('ZADD', K.writers, until_ms, waiter)
  else
    redis.call('ZADD', K.waiters, now + wait_ms, waiter)
  end
end
if moved then
  wake(K, now, false)
end
if waiter ~= '' or moved then
  touch_waiters(K, now)
end

-- What keeps the caller out, and when that may change without a message. On its turn: a holder's
-- expiry. Behind the queue: the end of the head's registration, should its Baton stop renewing it
-- (only the head wakes at a holder's expiry). Behind a waiting writer: the end of its registration.
local blocking, change = -2, -1
local function sooner(ms)
  if ms >= 0 and (change < 0 or ms < change) then
    change = ms
  end
end
if holder[1] then
  blocking = redis.call('PTTL', K.state)
  if turn then
    sooner(blocking)
  end
elseif mode == 'x' and readers > 0 then
  local last = redis.call('ZRANGE', K.readers, -1, -1, 'WITHSCORES')
  blocking = tonumber(last[2]) - now
  if turn then
    local first = redis.call('ZRANGE', K.readers, 0, 0, 'WITHSCORES')
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
if extended then
  return {0, blocking, change}
end
return {0, blocking}
