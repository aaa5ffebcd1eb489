-- Release: undo one hold of the lease whose token is given; when none is left, delete the lock
-- and publish on its channel so that waiters on every Baton wake at once.
--
-- KEYS[1] state hash   KEYS[2] release channel (declared as a key: it shares the hash tag)
-- ARGV[1] token
--
-- Returns {1, holds left} when the token held the lock, {0, 0} when it did not.
local holder = redis.call('HMGET', KEYS[1], 'token', 'count')
if holder[1] ~= ARGV[1] then
  return {0, 0}
end
local count = tonumber(holder[2]) - 1
if count > 0 then
  redis.call('HSET', KEYS[1], 'count', count)
  return {1, count}
end
redis.call('DEL', KEYS[1])
redis.call(PUBLISH, KEYS[2], 'released')
return {1, 0}
