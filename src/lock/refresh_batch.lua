-- Refresh many leases in one call (the keepalive of many streams at once).
--
-- KEYS: per lease, its state, readers and shared keys (three per lease, as refresh.lua takes).
-- ARGV: per lease, its token and ttl ms (0 reuses the ttl the lease was acquired with).
--
-- Returns per lease, in order, the new remaining ttl in ms, or 0 when that token no longer holds
-- the lock (exclusive or shared).
local renewed = {}
for i = 1, #ARGV / 2 do
  local K = lock_keys({'state', 'readers', 'shared'}, (i - 1) * 3)
  local ttl = refresh_lease(K, ARGV[2 * i - 1], tonumber(ARGV[2 * i]), 0)
  renewed[i] = math.max(ttl, 0)
end
return renewed
