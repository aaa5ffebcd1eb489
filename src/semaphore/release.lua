-- Release: give a permit lease back and wake the waiters.
--
-- ARGV[1] token   ARGV[2] '1' for the clean-up of a grant whose caller never saw it, which keeps a
--                 lease that a retry with its idempotency key has claimed; '0' otherwise
-- ARGV[3] how long (ms) the token stays void (void.lua), after a call whose reply never came;
--         '0' for none
--
-- Returns 1 when the lease was still held, 0 when it had already expired (its permits are
-- reclaimed now) or the token is unknown, -1 when it was kept as claimed.
local now = clock()
local unclaimed_only, void_ms = ARGV[2] == '1', tonumber(ARGV[3])
if void_ms > 0 then
  void(V, ARGV[1], now, void_ms)
end
local expiry = redis.call('ZSCORE', H, ARGV[1])
if not expiry then
  return 0
end
if unclaimed_only and tonumber(expiry) > now and redis.call('HEXISTS', D, 'c:' .. ARGV[1]) == 1 then
  return -1
end
drop_holder(ARGV[1])
redis.call(PUBLISH, C, 'released')
touch(now)
if tonumber(expiry) <= now then
  return 0
end
return 1
