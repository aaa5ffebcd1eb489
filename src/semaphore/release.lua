-- Release: give a permit lease back and wake the waiters.
--
-- ARGV[1] token
--
-- Returns 1 when the lease was still held, 0 when it had already expired (its permits are
-- reclaimed now) or the token is unknown.
local now = clock()
local expiry = redis.call('ZSCORE', H, ARGV[1])
if not expiry then
  return 0
end
drop_holder(ARGV[1])
redis.call(PUBLISH, C, 'released')
touch(now)
if tonumber(expiry) <= now then
  return 0
end
return 1
