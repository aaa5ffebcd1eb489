-- Release: undo one hold of the lease (exclusive or shared) whose token is given. When its last
-- hold goes and the lock becomes free of what kept waiters out, wake them: the fair queue's head
-- (by a message addressed to it), or with nobody queued every waiter on every Baton at once.
--
-- KEYS: state, channel, then readers, shared, queue, waiters, writers (see the prelude; callers of
-- the first version pass only the first two).
-- ARGV[1] token
--
-- Returns {1, holds left} when the token held the lock, {0, 0} when it did not (an expired shared
-- lease is cleaned up then).
local K = lock_keys({'state', 'channel', 'readers', 'shared', 'queue', 'waiters', 'writers'})
local token = ARGV[1]

local holder = redis.call('HMGET', K.state, 'token', 'count')
if holder[1] == token then
  local count = tonumber(holder[2]) - 1
  if count > 0 then
    redis.call('HSET', K.state, 'count', count)
    return {1, count}
  end
  redis.call('DEL', K.state)
  wake(K, clock(), true)
  return {1, 0}
end

local expiry = redis.call('ZSCORE', K.readers, token)
if not expiry then
  return {0, 0}
end
local now = clock()
local r = reader(K, token)
if tonumber(expiry) <= now or not r then
  drop_reader(K, token)
  touch_readers(K, now)
  return {0, 0}
end
if r.count > 1 then
  r.count = r.count - 1
  save_reader(K, token, r)
  return {1, r.count}
end
drop_reader(K, token)
reclaim_readers(K, now)
touch_readers(K, now)
if redis.call('ZCARD', K.readers) == 0 then
  wake(K, now, true)
end
return {1, 0}
