-- Refresh: set the remaining ttl of the lease whose token is given.
--
-- KEYS[1] state hash
-- ARGV[1] token   ARGV[2] ttl ms (0 reuses the ttl the lease was acquired with)
-- ARGV[3] smallest ttl accepted (ms); a smaller resulting ttl changes nothing
--
-- Returns the new remaining ttl in ms, -1 when the token does not hold the lock, or -2 when the
-- ttl would be below ARGV[3].
local holder = redis.call('HMGET', KEYS[1], 'token', 'ttl')
if holder[1] ~= ARGV[1] then
  return -1
end
local ttl = tonumber(ARGV[2])
if ttl == 0 then
  ttl = tonumber(holder[2])
end
if ttl < tonumber(ARGV[3]) then
  return -2
end
redis.call('PEXPIRE', KEYS[1], ttl)
return ttl
