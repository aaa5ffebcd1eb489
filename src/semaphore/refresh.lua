-- Refresh: set the remaining ttl of a held permit lease.
--
-- ARGV[1] token   ARGV[2] ttl ms (0 reuses the acquisition ttl)   ARGV[3] smallest ttl accepted
--
-- Returns the new remaining ttl in ms, -1 when the token holds no unexpired lease, or -2 when the
-- ttl would be below ARGV[3] (nothing changes then).
return refresh_lease(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), clock())
