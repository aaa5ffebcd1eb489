-- Release: give a permit lease back and wake the waiters.
--
-- ARGV[1] token   ARGV[2] for the clean-up of a grant whose caller never saw it, how long (ms) the
--                 token stays void (void.lua); such a clean-up keeps a lease that a retry with
--                 its idempotency key has claimed. '0' for a plain release.
--
-- Returns 1 when the lease was still held, 0 when it had already expired (its permits are
-- reclaimed now) or the token is unknown, -1 when it was kept as claimed.
local now = clock()
local void_ms = tonumber(ARGV[2])
if void_ms > 0 then
  void(V, ARGV[1], now, void_ms)
end
local expiry = redis.call('ZSCORE', H, ARGV[1])
if not expiry then
  return 0
end
if void_ms > 0 and tonumber(expiry) > now and redis.call('HEXISTS', D, 'c:' .. ARGV[1]) == 1 then
  return -1
end
drop_holder(ARGV[1])
redis.call(PUBLISH, C, 'released')
touch(now)
if tonumber(expiry) <= now then
  return 0
end
return 1
