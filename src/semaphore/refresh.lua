-- Refresh: set the remaining ttl of a held permit lease.
--
-- ARGV[1] token   ARGV[2] ttl ms (0 reuses the acquisition ttl)   ARGV[3] smallest ttl accepted
--
-- Returns the new remaining ttl in ms, -1 when the token holds no unexpired lease, or -2 when the
-- ttl would be below ARGV[3] (nothing changes then).
local now = clock()
local expiry = redis.call('ZSCORE', H, ARGV[1])
if not expiry or tonumber(expiry) <= now then
  return -1
end
local h = holder(ARGV[1])
if not h then
  return -1
end
local ttl = tonumber(ARGV[2])
if ttl == 0 then
  ttl = h.ttl
end
if ttl < tonumber(ARGV[3]) then
  return -2
end
redis.call('ZADD', H, 'XX', now + ttl, ARGV[1])
touch(now)
return ttl
